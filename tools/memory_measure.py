"""
The memory plan measured: fake_peak_memory is the peak of one training micro-step of a train.py
config on fake tensors (torch's MemTracker: real shapes, no memory, no GPU), what train.py
--dry_run's plan (memory_plan.py) is held to by tests/test_gpu_path.py at reduced depth and by
tools/memory_tables.py --measure=True at full depth. A tool of its own, not part of
lmkit/memory_plan.py: it runs the micro-step (distill.compute_loss) under MemTracker, which only
what measures should pay the import of (seconds). PeakMemory measures a real run's peak, on a GPU
or on the CPU, for tools/bench.py and tools/gpu_check.py.
"""
import re
import sys
import warnings
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker

from distill import compute_loss
from lmkit import fused_kd
from lmkit.distributed import apply_fsdp
from lmkit.memory_plan import plan_dtype
from lmkit.runs import configure_optimizers
from model import GPT


class PeakMemory:
    """Peak bytes allocated during the `with` block (beyond what was live when it started): CUDA's
    allocator peak (max_memory_allocated) on GPU; on CPU the rise of the process's peak resident set
    size (VmHWM, reset through /proc/self/clear_refs), which follows the live tensors only where
    freed memory leaves the process (tools/bench.py pins glibc's mmap threshold for that:
    bench.set_mmap_threshold)."""

    def __init__(self, device):
        self.device = device

    def _rss(self, field):
        return int(re.search(rf'{field}:\s+(\d+)',
                             open('/proc/self/status').read()).group(1)) * 1024

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


def fake_gpt(config, device, dtype=torch.float32):
    """A GPT of config in dtype on device, in the active FakeTensorMode (which must allow non-fake
    inputs): shapes and dtypes without memory or initialisation. It is built on the meta device
    outside the mode (a fake module's .to() cannot swap its parameters); to_empty gives every
    parameter a tensor of its own, so a tied lm_head is tied again."""
    with unset_fake_temporarily(), torch.device('meta'):
        model = GPT(config).to(dtype)
    model.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def fake_peak_memory(c, model_config, teacher_config):
    """Peak bytes one rank allocates in a micro-step of a run (c: its RunConfig; its dtype,
    micro-batch, DDP or FSDP over dry_run_world_size ranks, activation checkpointing, KD) of a
    model_config student and a teacher_config teacher (None: cross-entropy): torch's MemTracker on
    fake tensors, real shapes without memory, seconds per layer on a CPU. The micro-step is
    train.py's (compute_loss, then backward), with the gradients and AdamW's state already there
    (every micro-step's but a run's first). Every allocation is rounded up to 512 bytes, as by the
    CUDA allocator; kernels' workspaces, the CUDA context and fragmentation are not seen. How DDP,
    FSDP and CUDA's kernels are stood in for: docs/memory.md, "Checked against PyTorch"."""
    dtype = plan_dtype(c)
    dist.init_process_group('fake', rank=0, world_size=c.dry_run_world_size)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), \
                mock.patch.object(fused_kd, 'fp32_output_gemm', lambda device, dtype: True):
            student = fake_gpt(model_config, 'cpu')
            for layer in student.model.layers:
                layer.activation_checkpointing = c.activation_checkpointing
            # MemTracker hooks the gradients of every module that runs and refuses frozen
            # parameters: the teacher's require grad here, and get none (compute_loss runs it under
            # no_grad)
            teacher = fake_gpt(teacher_config, 'cpu',
                               getattr(torch, dtype)).eval() if teacher_config else None
            if c.fsdp:
                # FSDP builds its device mesh from a real tensor of ranks
                with unset_fake_temporarily():
                    apply_fsdp(student, dtype)
            optimizer = configure_optimizers(student, c.weight_decay, c.learning_rate,
                                             (c.beta1, c.beta2))
            for p in student.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()  # AdamW's state
            x = torch.zeros(c.micro_batch_size, model_config.block_size, dtype=torch.long)
            autocast = torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bfloat16')
            tracker = MemTracker()
            tracker.track_external(student, teacher, optimizer)
            with tracker, warnings.catch_warnings():
                # FSDP reduce-scatters and frees a layer's unsharded gradients before MemTracker's
                # hook, which reads them after accumulation, looks: a warning that it got None (they
                # were counted when made)
                warnings.filterwarnings('ignore',
                                        'Expected a tensor or a traceable wrapper-subclass')
                with autocast:
                    loss = compute_loss(student, student, teacher, x, x, c.kd_loss == 'fused',
                                        c.kd_temperature, c.kd_alpha)[0]
                loss.backward()
    finally:
        dist.destroy_process_group()
    return tracker.get_tracker_snapshot('peak')[torch.device('cpu')]['Total']


# a module, not a command: whoever runs it is told where its measurement runs
if __name__ == '__main__':
    print("tools/memory_measure.py is a module, not a command: its measurement runs in python -m "
          "tools.memory_tables --measure=True (every paper row at full depth) and in "
          "tests/test_gpu_path.py", file=sys.stderr)
    sys.exit(0 if {'-h', '--help'} & set(sys.argv[1:]) else 2)
