"""
Measuring a training step: MFU (a model's FLOPs per token, the device's peak FLOP/s, datasheet or
measured), the step's speed as its record gives it (StepMeter) and a device timer.
"""
import time
from contextlib import contextmanager

import torch


def flops_per_token(model, seq_len=None):
    """Training FLOPs per token of a GPT (PaLM, appendix B): 6 x (weights used in matmuls, lm_head
    included even when tied) + 12 x n_layer x n_head x head_dim x seq_len for QK^T and AV, the whole
    T x T counted although causal kernels skip the masked half (PaLM's convention).
    tests/test_mfu.py holds it against torch's FLOP counter."""
    cfg = model.config
    matmul_weights = sum(m.weight.numel() for m in model.modules()
                         if isinstance(m, torch.nn.Linear))
    return 6 * matmul_weights + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * (seq_len
                                                                                or cfg.block_size)


def estimate_mfu(model, fwdbwd_per_iter, dt, peak_flops, seq_len=None):
    """Model FLOPs utilisation: fwdbwd_per_iter sequences of seq_len tokens took dt seconds on a
    device whose peak is peak_flops (default_peak_flops)."""
    seq_len = seq_len or model.config.block_size
    return flops_per_token(model, seq_len) * seq_len * fwdbwd_per_iter / dt / peak_flops


# Datasheet dense bf16 peaks; the first key found in the device's name counts (the PCIe H100 before
# the SXM one)
KNOWN_PEAK_BF16 = {'H100 '
                   'PCIe': 756e12, 'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'L40S': 362e12,
                   'A10G': 125e12, '4090': 165e12}


def gemm_shapes(model, tokens):
    """(M, K, N) of each matmul a training step runs in the model's linear layers on `tokens` rows
    (micro-batch x sequence length): the forward (tokens x in)(in x out), and backward's input
    gradient (tokens x out)(out x in) and weight gradient (out x tokens)(tokens x in). They are
    flops_per_token's 6 x weights."""
    shapes = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            n_out, n_in = m.weight.shape
            shapes |= {(tokens, n_in, n_out), (tokens, n_out, n_in), (n_out, tokens, n_in)}
    return sorted(shapes)


def matmul_seconds(a, b, reps):
    """Wall time of reps products a @ b, the device's queue drained before and after."""
    if a.is_cuda:
        torch.cuda.synchronize(a.device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if a.is_cuda:
        torch.cuda.synchronize(a.device)
    return time.perf_counter() - t0


def measured_matmul_flops(device, dtype, shapes, trials=5):
    """Peak FLOP/s of this device for matmuls in dtype, measured: the best of a few ~10 ms timings
    of each (M, K, N) of shapes (gemm_shapes: the model's own, so that no matmul the model runs goes
    faster than the peak). A timing can only err low (a busy moment), hence the best. On CPU: one
    thread's best times the threads training uses (torch.get_num_threads()). Timed with every
    thread, a matmul waits for its slowest thread, and on a machine whose cores are shared one busy
    core halved the measured peak (train.py then logged MFUs of 120-130%); one thread finds a free
    core far more often, and n threads do at most n times one thread's work."""
    threads, best = torch.get_num_threads(), 0.0
    torch.set_num_threads(1)  # (a GPU's matmuls use no CPU threads)
    try:
        for shape in shapes:
            # no faster beyond, only bigger (a 1B model's logits: 8 GB)
            m, k, n = (min(d, 8192) for d in shape)
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            a @ b  # warm-up: the first call picks the kernel and allocates
            reps = max(1, int(0.01 / matmul_seconds(a, b, 1)))
            best = max(best,
                       *(2 * m * k * n * reps / matmul_seconds(a, b, reps) for _ in range(trials)))
    finally:
        torch.set_num_threads(threads)
    return best * (threads if device.type == 'cpu' else 1)


def default_peak_flops(device, dtype, shapes):
    """Dense peak FLOP/s of one device for matmuls in dtype (bf16 under autocast): the datasheet's
    for a known GPU in bf16, else measured_matmul_flops over the model's matmul shapes. The table is
    bf16 only: float32 matmuls on an H100 peak at 67 TFLOP/s (TF32 off, PyTorch's default), 1/15 of
    its bf16 peak."""
    if device.type == 'cuda' and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        for key, flops in KNOWN_PEAK_BF16.items():
            if key in name:
                return flops
    return measured_matmul_flops(device, dtype, shapes)


class StepMeter:
    """What a training step's record says about its speed: tokens per second, MFU against the
    device's peak (peak_flops, or default_peak_flops' when it is None), the step's seconds and, on
    CUDA, this rank's peak memory so far (to compare with the memory plan). A step trains
    `sequences` sequences in all, split over `ranks` ranks in micro-batches of `micro_batch`."""

    def __init__(self, model, device, dtype, sequences, ranks, micro_batch, peak_flops=None):
        self.model, self.device, self.sequences, self.ranks = model, device, sequences, ranks
        self.peak_flops = peak_flops or default_peak_flops(
            device, dtype, gemm_shapes(model, micro_batch * model.config.block_size))

    def record(self, dt):
        """The speed of a step that took dt seconds."""
        record = dict(tokens_per_sec=self.sequences * self.model.config.block_size / dt,
                      mfu=estimate_mfu(self.model, self.sequences / self.ranks, dt,
                                       self.peak_flops), dt=dt)
        if self.device.type == 'cuda':
            record['peak_memory_gib'] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
        return record


class DeviceTimer:
    """Time spent in code blocks on the device, without synchronising: CUDA events (read after the
    step's own synchronisation), wall clock on CPU."""

    def __init__(self, device):
        self.cuda, self.spans = device.type == 'cuda', []

    @contextmanager
    def __call__(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.spans.append(time.perf_counter() - t0)

    def seconds(self):
        """The total since the last call (after a synchronisation, on CUDA)."""
        total = sum(s.elapsed_time(e) / 1000 for s,
                    e in self.spans) if self.cuda else sum(self.spans)
        self.spans = []
        return total
