"""
Where a model runs: the device and dtype --device / --dtype name, the C++ compiler torch.compile
needs on a CPU; over torchrun's ranks, compiled per layer, sharded with FSDP2 or wrapped in DDP, and
the ranks' plumbing. docs/training.md, "Ranks", says why each does what it does.
"""
import inspect
import math
import os
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lmkit.errors import RunError, on_stop_signals


def resolve_device(name):
    """--device as a torch.device ('auto': cuda where there is a GPU, else cpu); a RunError before
    any work for a device this machine lacks."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(name)
    except RuntimeError:  # 'gpu', 'cuda:x', ''
        raise RunError(f"--device={name}: not a device name; use auto, cpu, cuda, cuda:N (N: a "
                       "GPU's index) or mps") from None
    if device.type == 'cpu':
        return device
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, ...: it says it is there
    present = hasattr(backend, 'is_available') and backend.is_available()
    count = backend.device_count() if present else 0
    if count == 0:
        if device.type == 'cuda' and not torch.backends.cuda.is_built():
            why = (f"this torch ({torch.__version__}) was built without CUDA: install a CUDA build "
                   "of torch, or use")
        elif backend is None:
            why = f"the scripts do not run on {device.type} devices; use"
        else:
            why = (f"torch sees no {device.type} device here (torch.{device.type}.is_available() "
                   "is False); use")
        raise RunError(f"--device={name}: {why} --device=cpu (or auto: a GPU where there is one)")
    if device.index is not None and device.index >= count:
        last = f' to {device.type}:{count - 1}' if count > 1 else ''
        raise RunError(f"--device={name}: this machine has {count} {device.type} "
                       f"device{'s' * (count > 1)} ({device.type}:0{last}); give one of them")
    return device


def resolve_dtype(name, device):
    """--dtype's name ('float32', 'bfloat16'): 'auto' is bfloat16 on a CUDA device that supports it,
    else float32. getattr(torch, name) is the dtype."""
    if name != 'auto':
        return name
    return 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'


def autocast(device):
    """The precision the tools time a step in: bf16 autocast on CUDA, float32 elsewhere."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')


def check_cpu_compiler():
    """torch.compile on CPU builds C++: without a compiler the first step would fail deep in a
    traceback, so say it in one line before any work."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()
    except Exception as e:  # torch's own InvalidCxxCompiler and whatever else its search raises
        raise RunError("compile=True on CPU needs a C++ compiler (TorchInductor builds C++): "
                       f"{str(e).strip().splitlines()[0]}. Install g++ or clang++, or pass "
                       "--compile=False (eager: about 1.2x slower in the sink study; "
                       "docs/benchmarks.md)") from None


# DDP must not sync buffers on each forward: alpha_ma's per-rank sums would be overwritten by rank
# 0's. Newer torch deprecates broadcast_buffers for forward_sync_buffers.
DDP_NO_BUFFER_SYNC = ({'forward_sync_buffers': False}
                      if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                      else {'broadcast_buffers': False})


def apply_fsdp(model, dtype):
    """FSDP2 in place: one group per decoder layer, the root group for the rest (kept gathered from
    forward to backward: the KD loss reads lm_head.weight); bfloat16 computes from fp32 shards."""
    # imported here: FSDP takes as long to import as torch itself, and every script imports this
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy()
    if dtype == 'bfloat16':
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)


def compile_layers(model, backend='inductor'):
    """torch.compile each decoder layer on its own, in place, as torchtitan does, and DDP's graph
    splitting off (process-wide); the rest runs eager. backend: the tests' aot_eager."""
    torch._dynamo.config.optimize_ddp = False
    for layer in model.model.layers:
        layer.compile(backend=backend)
    return model


def wrap_ddp(model, device):
    """DDP around the GPT, its gradients kept once, as views of the buckets. Wrap after the
    optimizer state is loaded (which initialises AdamW's state only while no .grad exists)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return DDP(model, device_ids=[device.index] if device.type == 'cuda' else None,
               gradient_as_bucket_view=True, **DDP_NO_BUFFER_SYNC)


def full_tensor(t):
    """A DTensor (an FSDP-sharded parameter, or a reduction over one) gathered whole; other tensors
    as they are. A collective under FSDP: every rank must call it."""
    dtensor = sys.modules.get('torch.distributed.tensor')
    return t.full_tensor() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def local_tensor(t):
    """This rank's shard of a DTensor; other tensors as they are. No collective."""
    dtensor = sys.modules.get('torch.distributed.tensor')  # not imported: t is no DTensor
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def nonfinite_model_tensors(model, device):
    """The names of the model's floating-point state-dict tensors that hold NaN or infinity, and
    how many such tensors there are. Every rank gets the same answer. A tensor is finite when its
    largest magnitude is, so one fused _foreach_norm checks them all."""
    named = [(n, local_tensor(t)) for n, t in model.state_dict().items() if t.is_floating_point()]
    bad = torch.zeros(len(named), device=device)
    held = [i for i, (_, t) in enumerate(named) if t.numel()]  # an empty shard has no maximum
    if held:
        norms = torch._foreach_norm([named[i][1] for i in held], math.inf)
        bad[held] = torch.stack([n.float() for n in norms]).isfinite().logical_not().float()
    bad = reduce_mean(bad, device)
    return [name for (name, _), flag in zip(named, bad) if flag > 0], len(named)


def init_distributed(backend):
    """init_process_group for torchrun's workers, each restart's keys apart from earlier attempts'
    in the agent's one store (a dead rank's address, read again, fails)."""
    store, rank, world = next(dist.rendezvous('env://'))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    dist.init_process_group(backend, store=dist.PrefixStore(f'train.py/attempt_{attempt}', store),
                            rank=rank, world_size=world)


def batch_to_device(arrays, device):
    """Numpy arrays (a micro-batch) as tensors on device; on CUDA through pinned memory with
    non_blocking (a copy from pageable memory would wait for the GPU's queued work)."""
    if device.type != 'cuda':
        return [torch.from_numpy(a).to(device) for a in arrays]
    return [torch.from_numpy(a).pin_memory().to(device, non_blocking=True) for a in arrays]


def reduce_mean(values, device):
    """The mean over ranks of a few numbers (a list of floats or a tensor), with one all_reduce."""
    t = torch.as_tensor(values, dtype=torch.float64, device=device).clone()
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.tolist()


@contextmanager
def preemption_flag():
    """While active, SIGTERM, SIGINT and SIGHUP only append to the yielded list: the loop finishes
    its step, saves and exits (cluster preemption, Ctrl-C, a closed terminal)."""
    flag = []
    with on_stop_signals(lambda signum, frame: flag.append(signum)):
        yield flag
