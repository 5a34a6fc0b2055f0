"""Where a model runs: its device and dtype, and torchrun's ranks (docs/training.md, "Ranks")."""
import inspect
import math
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lmkit.errors import RunError, on_stop_signals


def resolve_device(name):
    """--device as a torch.device, or a RunError before any work for a device this machine lacks."""
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
        why = (f"torch sees no {device.type} device here (torch.{device.type}.is_available() "
               "is False); use")
        if device.type == 'cuda' and not torch.backends.cuda.is_built():
            why = (f"this torch ({torch.__version__}) was built without CUDA: install a CUDA build "
                   "of torch, or use")
        elif backend is None:
            why = f"the scripts do not run on {device.type} devices; use"
        raise RunError(f"--device={name}: {why} --device=cpu (or auto: a GPU where there is one)")
    if device.index is not None and device.index >= count:
        last = f' to {device.type}:{count - 1}' if count > 1 else ''
        raise RunError(f"--device={name}: this machine has {count} {device.type} "
                       f"device{'s' * (count > 1)} ({device.type}:0{last}); give one of them")
    return device


def resolve_dtype(name, device):
    if name != 'auto':
        return name
    return 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')


def check_cpu_compiler():
    """A RunError before any work where torch.compile on a CPU finds no C++ compiler."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()
    except Exception as e:  # torch's own InvalidCxxCompiler and whatever else its search raises
        raise RunError("compile=True on CPU needs a C++ compiler (TorchInductor builds C++): "
                       f"{str(e).strip().splitlines()[0]}. Install g++ or clang++, or pass "
                       "--compile=False (eager: about 1.2x slower in the sink study; "
                       "docs/benchmarks.md)") from None


# DDP must not sync buffers on each forward, or rank 0's would overwrite alpha_ma's per-rank sums
DDP_NO_BUFFER_SYNC = ({'forward_sync_buffers': False}
                      if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                      else {'broadcast_buffers': False})


def apply_fsdp(model, dtype):
    """FSDP2 in place: a group per decoder layer, and a root group kept gathered for the KD loss."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # slow, so imported here
    policy = MixedPrecisionPolicy()
    if dtype == 'bfloat16':  # computed in bf16, gathered from the fp32 shards
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)


def compile_layers(model, backend='inductor'):
    """Compile each decoder layer on its own, in place (the tests use backend='aot_eager')."""
    torch._dynamo.config.optimize_ddp = False
    for layer in model.model.layers:
        layer.compile(backend=backend)
    return model


def wrap_ddp(model, device):
    """DDP with each .grad a view of its buckets. Wrap it after loading the optimizer state, which
    AdamW initialises only while no .grad exists."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return DDP(model, device_ids=[device.index] if device.type == 'cuda' else None,
               gradient_as_bucket_view=True, **DDP_NO_BUFFER_SYNC)


def full_tensor(t):
    """A DTensor gathered whole (a collective every rank must call); other tensors as they are."""
    return t.full_tensor() if hasattr(t, 'full_tensor') else t  # DTensor is slow to import


def nonfinite_model_tensors(model, device):
    """(the names of the model's float tensors that hold NaN or infinity, how many float tensors
    it has), the same on every rank: each rank checks its own shards of them."""
    named = [(n, t) for n, t in model.state_dict().items() if t.is_floating_point()]
    shards = [t.to_local() if hasattr(t, 'to_local') else t for _, t in named]  # (FSDP's DTensors)
    # a tensor is finite when its largest magnitude is: one reduction each, no copy, and one sync
    largest = [(torch.linalg.vector_norm(t, math.inf) if t.numel() else t.new_zeros(())).float()
               for t in shards]  # (an empty shard has nothing to check)
    bad = reduce_mean(torch.stack(largest).isfinite().logical_not().double(), device)
    return [name for (name, _), flag in zip(named, bad) if flag > 0], len(named)


def init_distributed(backend):
    """init_process_group for torchrun's workers, each restart's keys apart from earlier ones'."""
    store, rank, world = next(dist.rendezvous('env://'))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    dist.init_process_group(backend, store=dist.PrefixStore(f'train.py/attempt_{attempt}', store),
                            rank=rank, world_size=world)


def batch_to_device(arrays, device):
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
    """During the block a stop signal only appends to the yielded list: the loop saves and exits."""
    flag = []
    with on_stop_signals(lambda signum, frame: flag.append(signum)):
        yield flag
