"""MFU's two halves (lmkit/measure.py). The FLOPs: flops_per_token against torch's own FLOP
counter over a real forward and backward of every variant. The peak: measured where the model's
matmuls run (their shapes, their dtype) and in a way a busy core cannot halve (train.py logged MFUs
of 120-130% on a shared 2-core CPU when it could). Timings are never pass/fail here: the peak's
derivation is checked on the matmuls it runs and on a simulated clock."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from lmkit import measure
from lmkit.measure import default_peak_flops, flops_per_token, gemm_shapes, measured_matmul_flops
from model import ATTENTIONS, GPT, MODEL_SHAPES, ModelConfig

torch.set_num_threads(2)
aten = torch.ops.aten
SHAPES = {
    'tiny': dict(MODEL_SHAPES['tiny']),  # config/tiny_cpu.py, the quick start's students
    'wider': dict(n_layer=2, n_head=8, n_kv_head=2, n_embd=256, intermediate_size=688,
                  vocab_size=1000,
                  # GQA 4:1, biases, an lm_head of its own
                  block_size=512, qkv_bias=True, tie_embeddings=False),
}


def training_step(model, batch, dtype=torch.float32):
    """One forward and backward as train.py runs them (bf16: under autocast)."""
    x = torch.randint(0, model.config.vocab_size, (batch, model.config.block_size + 1))
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('attention', ATTENTIONS)
def test_flops_per_token_is_torchs_count_of_a_training_step(shape, attention):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**SHAPES[shape], attention=attention))
    cfg, B = model.config, 2
    # torch's counter knows the CUDA attention kernels, not CPU's flash kernel (which the sink's LSE
    # path calls too): it is given torch's own formulas for them
    cpu_attention = {
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda grad, q, k, v, *args, out_shape=None,
                     **kwargs: sdpa_backward_flop_count(grad, q, k, v)}
    with FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
        training_step(model, B)
    # Tolerance: none, once the one known difference is taken out. Torch counts 7 attention matmuls
    # per layer, the flash backward's recomputation of QK^T included; model FLOPs (PaLM's
    # convention) count the 6 the math needs. Both count the whole T x T where causal kernels
    # compute half, and neither counts elementwise work (norms, RoPE, softmax, the gate's sigmoid,
    # affine's alpha and running mean of V, the sink's correction).
    recomputed_qk = cfg.n_layer * 2 * B * cfg.n_head * cfg.block_size ** 2 * cfg.head_dim
    assert flops_per_token(model) * B * cfg.block_size == counter.get_total_flops() - recomputed_qk


class Matmuls(TorchDispatchMode):
    """Records (M, K, N, dtype, CPU threads) of every matrix product run under it."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (aten.mm.default, aten.addmm.default):
            a, b = args[-2:]
            self.seen.add((a.shape[0], a.shape[1], b.shape[1], a.dtype, torch.get_num_threads()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_the_cpu_peak_is_measured_on_the_matmuls_training_runs(dtype):
    """The peak must be at least what any of the step's matmuls achieves: measured on each of them,
    in their dtype, and one thread at a time (scaled to the threads after: the next test)."""
    for attention in ATTENTIONS:
        model = GPT(ModelConfig(**dict(SHAPES['tiny'], block_size=64), attention=attention))
        with Matmuls() as step:
            training_step(model, 2, dtype)
        with Matmuls() as peak:
            default_peak_flops(torch.device('cpu'), dtype, gemm_shapes(model, 2 * 64))
        assert {(m, k, n, dtype, 2) for m, k, n in gemm_shapes(model, 2 * 64)} == step.seen
        assert {(m, k, n, dtype, 1) for m, k, n in gemm_shapes(model, 2 * 64)} == peak.seen
        assert torch.get_num_threads() == 2  # given back to training


def test_a_busy_core_does_not_lower_the_cpu_peak(monkeypatch):
    """A simulated clock: 2 cores at RATE FLOP/s each, one of them busy. A matmul split over both
    threads waits for the one on the busy core, so timed with every thread it looks no faster than
    one thread alone: the old measurement (half the peak, MFU > 100%). One thread's timing times 2
    must still give the machine's 2 x RATE."""
    rate = 1e11

    def busy_core_seconds(a, b, reps):
        flops, threads = 2 * a.shape[0] * a.shape[1] * b.shape[1] * reps, torch.get_num_threads()
        return flops / rate if threads == 1 else (flops / threads) / (rate / 2)

    monkeypatch.setattr(measure, 'matmul_seconds', busy_core_seconds)
    assert measured_matmul_flops(torch.device('cpu'), torch.float32,
                                 [(256, 128, 384)]) == pytest.approx(2 * rate)


def test_a_gpu_uses_its_datasheet_peak_for_bf16_only(monkeypatch):
    """NVIDIA's datasheets, dense bf16: H100 SXM 989 TFLOP/s, H100 PCIe 756. A float32 run must not
    be held against those (an H100 does 67 TFLOP/s of float32): its peak is measured in float32."""
    monkeypatch.setattr(measure, 'measured_matmul_flops', lambda device, dtype,
                        shapes: ('measured', dtype))
    cuda, shapes = torch.device('cuda'), [(4096, 2048, 2048)]
    for name, bf16_peak in [('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H100 PCIe', 756e12)]:
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device, name=name: name)
        assert default_peak_flops(cuda, torch.bfloat16, shapes) == bf16_peak
        assert default_peak_flops(cuda, torch.float32, shapes) == ('measured', torch.float32)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device: 'Some Future GPU')
    assert default_peak_flops(cuda, torch.bfloat16, shapes) == ('measured', torch.bfloat16)
