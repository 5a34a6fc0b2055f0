"""Measuring a training step: MFU (the model's FLOPs per token against the device's peak FLOP/s,
from its datasheet or measured), the speed a step's record logs (StepMeter) and a device timer."""
import time
from contextlib import contextmanager

import torch

# Datasheet dense bf16 peaks; the first key in the device's name counts (the PCIe H100 comes first)
KNOWN_PEAK_BF16 = {'H100 PCIe': 756e12, 'H100': 989e12, 'H200': 989e12, 'A100': 312e12,
                   'L40S': 362e12, 'A10G': 125e12, '4090': 165e12}


def flops_per_token(model, seq_len=None):
    """Training FLOPs per token as PaLM counts them (appendix B): 6 x the matmuls' weights (a tied
    lm_head's too) plus QK^T and AV over the whole T x T, twice what causal kernels compute."""
    cfg, seq_len = model.config, seq_len or model.config.block_size
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 6 * weights + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len


def estimate_mfu(model, fwdbwd_per_iter, dt, peak_flops, seq_len=None):
    """Model FLOPs utilisation of fwdbwd_per_iter sequences of seq_len tokens in dt seconds."""
    seq_len = seq_len or model.config.block_size
    return flops_per_token(model, seq_len) * seq_len * fwdbwd_per_iter / dt / peak_flops


def gemm_shapes(model, tokens):
    """(M, K, N) of the matmuls of a step's linear layers on `tokens` rows: the forward, x W^T, and
    backward's input gradient, g W, and weight gradient, g^T x (flops_per_token's 6 x weights)."""
    shapes = set()
    for n_out, n_in in (m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)):
        shapes |= {(tokens, n_in, n_out), (tokens, n_out, n_in), (n_out, tokens, n_in)}
    return sorted(shapes)


def matmul_seconds(a, b, reps):
    """Wall time of reps products a @ b, the device's queue drained before and after."""
    drain = torch.cuda.synchronize if a.is_cuda else lambda device: None
    drain(a.device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    drain(a.device)
    return time.perf_counter() - t0


def measured_matmul_flops(device, dtype, shapes, trials=5):
    """Peak FLOP/s of this device for matmuls in dtype: the best of a few ~10 ms timings of each of
    the model's own shapes. On CPU, one thread's best times the threads, as a matmul on every thread
    waits for its slowest: one busy core of a shared machine halved the peak (MFUs of 120-130%)."""
    threads, best = torch.get_num_threads(), 0.0
    torch.set_num_threads(1)  # (a GPU's matmuls use no CPU threads)
    try:
        for shape in shapes:
            m, k, n = (min(d, 8192) for d in shape)  # no faster beyond, only bigger
            a, b = (torch.randn(*size, device=device, dtype=dtype) for size in ((m, k), (k, n)))
            a @ b  # warm-up: the first call picks the kernel and allocates
            reps = max(1, int(0.01 / matmul_seconds(a, b, 1)))
            seconds = min(matmul_seconds(a, b, reps) for _ in range(trials))
            best = max(best, 2 * m * k * n * reps / seconds)
    finally:
        torch.set_num_threads(threads)
    return best * (threads if device.type == 'cpu' else 1)


def default_peak_flops(device, dtype, shapes):
    """Dense peak FLOP/s of one device for matmuls in dtype: the datasheet's for a known GPU in bf16
    (only: an H100's float32 peak is 67 TFLOP/s, not 989), else measured_matmul_flops."""
    if device.type == 'cuda' and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        if peak := next((flops for key, flops in KNOWN_PEAK_BF16.items() if key in name), None):
            return peak
    return measured_matmul_flops(device, dtype, shapes)


class StepMeter:
    """A step's speed as its record logs it: tokens/s, MFU, seconds and, on CUDA, this rank's peak
    memory so far. A step trains `sequences` sequences on `ranks` ranks, micro_batch at a time."""

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
    """Time in code blocks on the device: CUDA events, which add no synchronisation, or a clock."""

    def __init__(self, device):
        self.cuda, self.spans = device.type == 'cuda', []

    def _now(self):
        if self.cuda:  # an event recorded on the current stream
            return torch.cuda.current_stream().record_event(torch.cuda.Event(enable_timing=True))
        return time.perf_counter()

    @contextmanager
    def __call__(self):
        start = self._now()
        yield
        self.spans.append((start, self._now()))

    def seconds(self):
        """The total since the last call (after a synchronisation, on CUDA)."""
        spans, self.spans = self.spans, []
        return sum(s.elapsed_time(e) / 1000 if self.cuda else e - s for s, e in spans)
