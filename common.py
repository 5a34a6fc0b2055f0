"""
What every script shares and none owns: the device and dtype its --device/--dtype name, MFU (a model's FLOPs per
token and the device's peak FLOP/s) and a progress line.
Imports flow one way: this file imports only torch, and every script may import it.
"""
import sys
import time

import torch


def resolve_device(name):
    """--device as a torch.device: 'auto' is cuda where there is a GPU, else cpu; any other name as given."""
    return torch.device(('cuda' if torch.cuda.is_available() else 'cpu') if name == 'auto' else name)


def resolve_dtype(name, device):
    """--dtype's name ('float32', 'bfloat16', ...): 'auto' is bfloat16 on a CUDA device that supports it (where
    autocast / bf16 weights pay off), else float32. A name, for configs; getattr(torch, name) is the dtype."""
    if name != 'auto':
        return name
    return 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'


def flops_per_token(model, seq_len=None):
    """Training FLOPs per token of a GPT (PaLM, appendix B): 6 x (weights used in matmuls, lm_head included even when
    tied) + 12 x n_layer x n_head x head_dim x seq_len for QK^T and AV (causal masking not credited)."""
    cfg = model.config
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 6 * matmul_weights + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * (seq_len or cfg.block_size)


def estimate_mfu(model, fwdbwd_per_iter, dt, peak_flops, seq_len=None):
    """Model FLOPs utilisation: fwdbwd_per_iter sequences of seq_len tokens took dt seconds on a device whose peak is
    peak_flops (default_peak_flops)."""
    seq_len = seq_len or model.config.block_size
    return flops_per_token(model, seq_len) * seq_len * fwdbwd_per_iter / dt / peak_flops


KNOWN_PEAK_BF16 = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'L40S': 362e12, 'A10G': 125e12, '4090': 165e12}


def measured_matmul_flops(device, dtype, trials=5):
    """FLOP/s of a large square matmul on this device: the best of a few timings, since on a shared machine one
    can land in a busy moment (and an MFU above 100% would follow)."""
    n = 1024 if device.type == 'cpu' else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    a @ a  # warm-up
    best = 0.0
    for _ in range(trials):
        if device.type == 'cuda':
            torch.cuda.synchronize()
        t0, reps = time.perf_counter(), 5
        for _ in range(reps):
            a @ a
        if device.type == 'cuda':
            torch.cuda.synchronize()
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def default_peak_flops(device, dtype):
    """Dense peak FLOP/s of one device: datasheet values for known GPUs (bf16), else measured with a matmul."""
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
        for key, flops in KNOWN_PEAK_BF16.items():
            if key in name:
                return flops
    return measured_matmul_flops(device, dtype)



class Progress:
    """One line on stderr, rewritten in place at most twice a second (and at the end)."""

    def __init__(self, name, total):
        self.name, self.total, self.t0, self.shown = name, total, time.time(), 0.0

    def __call__(self, done):
        now = time.time()
        if done != self.total and now - self.shown < 0.5:
            return
        self.shown = now
        rate = done / max(now - self.t0, 1e-9)
        end = '\n' if done == self.total else ''
        print(f"\r{self.name}: {done}/{self.total} ({rate:.1f}/s)", end=end, file=sys.stderr, flush=True)


