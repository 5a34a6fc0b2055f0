"""
What every script shares and none owns: the device and dtype its --device/--dtype name, MFU (a model's FLOPs per token
and the device's peak FLOP/s), timers and a progress line; what tools/bench.py's tables and tools/gpu_check.py's rows
measure and print with (autocast, PeakMemory, log, ratio, print_table); and how a model runs over torchrun's ranks
(compiled per layer, sharded with FSDP2 or wrapped in DDP; init_distributed, reduce_mean, full_tensor, batch_to_device,
local_tensor, preemption_flag) and initialised (init_matched), which train.py, tools/bench.py, tools/gpu_check.py and
the tests share. Imports flow one way: this file imports only torch and files.py, and every script may import it.
"""
import hashlib
import inspect
import os
import re
import signal
import sys
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from files import RunError


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


def flops_per_token(model, seq_len=None):
    """Training FLOPs per token of a GPT (PaLM, appendix B): 6 x (weights used in matmuls, lm_head included even when
    tied) + 12 x n_layer x n_head x head_dim x seq_len for QK^T and AV, the whole T x T counted although causal
    kernels skip the masked half (PaLM's convention). tests/test_mfu.py holds it against torch's FLOP counter."""
    cfg = model.config
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 6 * matmul_weights + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * (seq_len or cfg.block_size)


def estimate_mfu(model, fwdbwd_per_iter, dt, peak_flops, seq_len=None):
    """Model FLOPs utilisation: fwdbwd_per_iter sequences of seq_len tokens took dt seconds on a device whose peak is
    peak_flops (default_peak_flops)."""
    seq_len = seq_len or model.config.block_size
    return flops_per_token(model, seq_len) * seq_len * fwdbwd_per_iter / dt / peak_flops


# Datasheet dense bf16 peaks; the first key found in the device's name counts (the PCIe H100 before the SXM one)
KNOWN_PEAK_BF16 = {'H100 PCIe': 756e12, 'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'L40S': 362e12,
                   'A10G': 125e12, '4090': 165e12}


def gemm_shapes(model, tokens):
    """(M, K, N) of each matmul a training step runs in the model's linear layers on `tokens` rows (micro-batch x
    sequence length): the forward (tokens x in)(in x out), and backward's input gradient (tokens x out)(out x in)
    and weight gradient (out x tokens)(tokens x in). They are flops_per_token's 6 x weights."""
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
    """Peak FLOP/s of this device for matmuls in dtype, measured: the best of a few ~10 ms timings of each (M, K, N)
    of shapes (gemm_shapes: the model's own, so that no matmul the model runs goes faster than the peak). A timing
    can only err low (a busy moment), hence the best. On CPU: one thread's best times the threads training uses
    (torch.get_num_threads()). Timed with every thread, a matmul waits for its slowest thread, and on a machine
    whose cores are shared one busy core halved the measured peak (train.py then logged MFUs of 120-130%); one
    thread finds a free core far more often, and n threads do at most n times one thread's work."""
    threads, best = torch.get_num_threads(), 0.0
    torch.set_num_threads(1)  # (a GPU's matmuls use no CPU threads)
    try:
        for shape in shapes:
            m, k, n = (min(d, 8192) for d in shape)  # no faster beyond, only bigger (a 1B model's logits: 8 GB)
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            a @ b  # warm-up: the first call picks the kernel and allocates
            reps = max(1, int(0.01 / matmul_seconds(a, b, 1)))
            best = max(best, *(2 * m * k * n * reps / matmul_seconds(a, b, reps) for _ in range(trials)))
    finally:
        torch.set_num_threads(threads)
    return best * (threads if device.type == 'cpu' else 1)


def default_peak_flops(device, dtype, shapes):
    """Dense peak FLOP/s of one device for matmuls in dtype (bf16 under autocast): the datasheet's for a known GPU
    in bf16, else measured_matmul_flops over the model's matmul shapes. The table is bf16 only: float32 matmuls on
    an H100 peak at 67 TFLOP/s (TF32 off, PyTorch's default), 1/15 of its bf16 peak."""
    if device.type == 'cuda' and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        for key, flops in KNOWN_PEAK_BF16.items():
            if key in name:
                return flops
    return measured_matmul_flops(device, dtype, shapes)


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


class DeviceTimer:
    """Time spent in code blocks on the device, without synchronising: CUDA events (read after the step's
    own synchronisation), wall clock on CPU."""

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
        total = sum(s.elapsed_time(e) / 1000 for s, e in self.spans) if self.cuda else sum(self.spans)
        self.spans = []
        return total


# -----------------------------------------------------------------------------
# Measuring and reporting: what tools/bench.py's tables and tools/gpu_check.py's rows share


def autocast(device):
    """The precision tools/bench.py and tools/gpu_check.py time a step in: bf16 autocast on CUDA, float32 elsewhere."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')


class PeakMemory:
    """Peak bytes allocated during the `with` block (beyond what was live when it started): CUDA's allocator peak
    (max_memory_allocated) on GPU; on CPU the rise of the process's peak resident set size (VmHWM, reset through
    /proc/self/clear_refs), which follows the live tensors only where freed memory leaves the process (tools/bench.py
    pins glibc's mmap threshold for that: bench.set_mmap_threshold)."""

    def __init__(self, device):
        self.device = device

    def _rss(self, field):
        return int(re.search(rf'{field}:\s+(\d+)', open('/proc/self/status').read()).group(1)) * 1024

    def __enter__(self):
        if self.device.type == 'cuda':
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')  # reset VmHWM to the current resident size
            self.start = self._rss('VmRSS')
        return self

    def __exit__(self, *exc):
        if self.device.type == 'cuda':
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self.peak = self._rss('VmHWM') - self.start


def log(message):
    """A progress line on stderr: stdout holds the Markdown tables."""
    print(message, file=sys.stderr, flush=True)


def ratio(x, base):
    return f'{x / base:.2f}' if base else '-'


def print_table(title, notes, header, rows):
    """One section: a heading, what was measured and how, and a Markdown table of already formatted cells."""
    print(f'\n## {title}\n\n{notes}\n')
    print('| ' + ' | '.join(header) + ' |')
    print('|' + '---|' * len(header))
    for row in rows:
        print('| ' + ' | '.join(row) + ' |')
    sys.stdout.flush()


# -----------------------------------------------------------------------------
# Running over torchrun's ranks: the model compiled, sharded or wrapped; the ranks' plumbing

# DDP must not sync buffers on each forward: alpha_ma's per-rank sums would be overwritten by rank 0's (see
# GPT.update_alpha_ma). Newer torch (2.13 here) deprecates broadcast_buffers for forward_sync_buffers, which still
# syncs once at init: harmless, all ranks start equal.
DDP_NO_BUFFER_SYNC = ({'forward_sync_buffers': False} if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                      else {'broadcast_buffers': False})


def apply_fsdp(model, dtype):
    """FSDP2 in place: one group per decoder layer (gathered just before its forward and its backward, freed
    after), the root group for the rest. bfloat16: gathered and computed in bf16 from the fp32 shards (the master
    weights), gradients reduce-scattered and accumulated in fp32. The root keeps its parameters gathered from
    forward to backward (FSDP's default for the root, stated here because the KD loss reads lm_head.weight after
    the forward)."""
    # imported here: FSDP and DTensor take as long to import as torch itself (they pull in sympy), and every script
    # imports this file (the quick start starts twenty processes)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == 'bfloat16' \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)


def init_matched(model, seed):
    """A GPT's init again, each module from a generator seeded by (seed, its name) alone rather than one stream in
    module order: variants built from one seed then start equal in every tensor they share and differ in their own
    (train.py's matched_init; the sink study's matched pairs). The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            torch.manual_seed(int.from_bytes(hashlib.sha256(f'{seed}:{name}'.encode()).digest()[:8], 'little'))
            model._init_weights(module)


def compile_layers(model, backend='inductor'):
    """torch.compile each decoder layer on its own, in place (nn.Module.compile), the way torchtitan does: one compiled
    graph serves every layer of a shape, so compiling takes seconds, not minutes; under DDP each layer's gradients are
    ready (and all-reduced in DDP's buckets) while the backward goes on through the layers below, which a single
    whole-model graph would only allow through DDP's graph splitting; and under FSDP2, whose per-layer hooks break any
    graph that spans layers, nothing falls back to eager. The rest (embeddings, final norm, lm_head, loss) runs eager.
    DDP's graph splitting is therefore turned off (torch._dynamo.config.optimize_ddp = False, for the whole process):
    dynamo would otherwise cut each layer's graph again at DDP's bucket boundaries (1 MiB, then 25 MiB: 5 graphs per
    1B layer), which adds no overlap that the per-layer graphs do not already give, only smaller graphs to fuse and
    more to compile. backend: torch.compile's (the tests trace with 'aot_eager', which generates no code)."""
    torch._dynamo.config.optimize_ddp = False
    for layer in model.model.layers:
        layer.compile(backend=backend)
    return model


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


def wrap_ddp(model, device):
    """DDP around the GPT, its gradients kept once: every .grad is created before DDP(...), which then turns them into
    views of its all-reduce buckets (gradient_as_bucket_view), and train.py's loop zeroes them in place
    (zero_grad(set_to_none=False)), so the no_sync micro-steps accumulate into the buckets instead of a second set.
    Wrap after the optimizer state is loaded (torch.distributed.checkpoint initialises AdamW's state only while no
    .grad exists)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return DDP(model, device_ids=[device.index] if device.type == 'cuda' else None, gradient_as_bucket_view=True,
               **DDP_NO_BUFFER_SYNC)


def full_tensor(t):
    """A DTensor (an FSDP-sharded parameter, or a reduction over one) gathered whole; other tensors as they are.
    A collective under FSDP: every rank must call it."""
    dtensor = sys.modules.get('torch.distributed.tensor')  # not imported (apply_fsdp does): t cannot be a DTensor
    return t.full_tensor() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def local_tensor(t):
    """This rank's shard of a DTensor (an FSDP-sharded parameter); other tensors as they are. No collective."""
    dtensor = sys.modules.get('torch.distributed.tensor')  # (see full_tensor)
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def init_distributed(backend):
    """init_process_group for torchrun's workers, with this attempt's keys apart from earlier attempts'. Under
    torchrun --max-restarts the workers of every attempt meet in the agent's one store; a restarted rank could read
    an address that a dead rank of the previous attempt had published there and fail to connect (seen with gloo:
    'connectFullMesh failed ... Connection refused')."""
    store, rank, world = next(dist.rendezvous('env://'))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    dist.init_process_group(backend, store=dist.PrefixStore(f'train.py/attempt_{attempt}', store), rank=rank,
                            world_size=world)


def batch_to_device(arrays, device):
    """Numpy arrays (a micro-batch) as tensors on device. On CUDA through pinned memory with non_blocking: a copy
    from pageable memory waits for the GPU's queued work, so the host could not launch the next kernels meanwhile."""
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
    """While active, SIGTERM / SIGINT only append to the yielded list: the loop finishes its step, saves a
    checkpoint and exits cleanly (cluster preemption, Ctrl-C)."""
    flag = []
    previous = {sig: signal.signal(sig, lambda signum, frame: flag.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
