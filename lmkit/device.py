"""
The device and dtype a script's --device / --dtype name (resolve_device, resolve_dtype), the precision a step is timed
in (autocast), and the C++ compiler torch.compile needs on a CPU (check_cpu_compiler).
"""

import torch

from lmkit.errors import RunError


def resolve_device(name):
    """--device as a torch.device: 'auto' is cuda where there is a GPU, else cpu; any other name must be a device
    this machine has (cuda, cuda:N, mps, ...), else a RunError before any work: torch itself would fail only at the
    first tensor moved there, with a traceback ('Torch not compiled with CUDA enabled')."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(name)
    except RuntimeError:  # 'gpu', 'cuda:x', ''
        raise RunError(f"--device={name}: not a device name; use auto, cpu, cuda, cuda:N (N: a GPU's index) or "
                       f"mps") from None
    if device.type == 'cpu':
        return device
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, ...: what can say it is there
    count = backend.device_count() if hasattr(backend, 'is_available') and backend.is_available() else 0
    if count == 0:
        if device.type == 'cuda' and not torch.backends.cuda.is_built():
            why = f"this torch ({torch.__version__}) was built without CUDA: install a CUDA build of torch, or use"
        elif backend is None:
            why = f"the scripts do not run on {device.type} devices; use"
        else:
            why = f"torch sees no {device.type} device here (torch.{device.type}.is_available() is False); use"
        raise RunError(f"--device={name}: {why} --device=cpu (or auto: a GPU where there is one)")
    if device.index is not None and device.index >= count:
        raise RunError(f"--device={name}: this machine has {count} {device.type} device{'s' * (count > 1)} "
                       f"({device.type}:0{f' to {device.type}:{count - 1}' if count > 1 else ''}); give one of them")
    return device


def resolve_dtype(name, device):
    """--dtype's name ('float32', 'bfloat16', ...): 'auto' is bfloat16 on a CUDA device that supports it (where
    autocast / bf16 weights pay off), else float32. A name, for configs; getattr(torch, name) is the dtype."""
    if name != 'auto':
        return name
    return 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'


# -----------------------------------------------------------------------------
# Measuring and reporting: what tools/bench.py's tables and tools/gpu_check.py's rows share


def autocast(device):
    """The precision tools/bench.py and tools/gpu_check.py time a step in: bf16 autocast on CUDA, float32 elsewhere."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')


# -----------------------------------------------------------------------------
# Running over torchrun's ranks: the model compiled, sharded or wrapped; the ranks' plumbing


def check_cpu_compiler():
    """torch.compile on CPU makes TorchInductor generate C++, built with the machine's C++ compiler: without one the
    first step would fail deep in a traceback, so say it in one line before any work."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()
    except Exception as e:  # torch's own InvalidCxxCompiler and whatever else its search raises
        raise RunError(f"compile=True on CPU needs a C++ compiler (TorchInductor builds C++): "
                       f"{str(e).strip().splitlines()[0]}. Install g++ or clang++, or pass --compile=False "
                       f"(eager: about 1.2x slower in the sink study; docs/benchmarks.md)") from None


