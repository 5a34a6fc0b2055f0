"""
Train a student with the paper's recipe (Section 5.1, Appendix B.1), on one CPU or many GPUs.

    python train.py config/tiny_cpu.py --data_dir=data/builtin_bytes --max_iters=200      # a laptop CPU
    torchrun --standalone --nproc_per_node=8 train.py config/affine_1b.py                # one 8-GPU node (DDP)
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 --rdzv_id=JOB \
        train.py config/affine_3b.py                                                      # 16 GPUs, FSDP (fsdp=True)
    python train.py config/affine_3b.py --dry_run=True                      # parameter counts, per-GPU memory plan

Configuration, nanoGPT-style: the defaults below, then each config file (plain assignments), then
--key=value overrides (Python literals: 3e-4, None, True, [1, 2], {'a': 1}; anything else is a string).
Unknown keys and wrong types are errors. The resolved config is written to out_dir/config.json.

Data: step s trains on windows perm[s*G : (s+1)*G] of the train split (data.Windows), G the global
batch, perm a permutation seeded by (seed, epoch): every window once per epoch (the paper trains one epoch),
and a step's data depends only on (seed, step), never on the number of ranks or the micro-batch size. The
position to resume from is therefore just the step.

Scale: DDP keeps a full fp32 student and its AdamW state on every GPU (16 bytes a parameter); fsdp=True shards
them over the ranks with PyTorch's FSDP2 (fully_shard per decoder layer), activation_checkpointing=True trades
a recomputed forward for most activation memory. Checkpoints hold full (unsharded) state keyed by parameter
name either way, so a run resumes on any number of ranks, with or without FSDP. memory_estimate() is the plan.
"""
import ast
import dataclasses
import inspect
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from model import FIELD_NAMES, GPT, ModelConfig
from common import default_peak_flops
from data import Windows, read_meta

# DDP must not sync buffers on each forward: alpha_ma's per-rank sums would be overwritten by rank 0's (see
# GPT.update_alpha_ma). Newer torch (2.13 here) deprecates broadcast_buffers for forward_sync_buffers, which still
# syncs once at init: harmless, all ranks start equal.
DDP_NO_BUFFER_SYNC = ({'forward_sync_buffers': False} if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                      else {'broadcast_buffers': False})

SAVE_TIMEOUT = timedelta(hours=2)  # how long ranks wait for rank 0 to write a checkpoint (NCCL's default is 10 min)

# -----------------------------------------------------------------------------------------------
# Defaults: the paper's recipe. Model keys (ModelConfig's fields) come from the config file.
DEFAULTS = dict(
    out_dir='out',
    data_dir='data/fineweb_edu_llama3',  # a prepare_data.py output directory
    # 'auto': continue from out_dir/ckpt.pt if there is one (bit-exactly), else start fresh; 'resume': continue, and
    # refuse if there is none; 'scratch': start fresh, and refuse to replace an existing checkpoint unless overwrite
    init_from='auto',
    overwrite=False,  # with init_from='scratch': start over even though out_dir holds a checkpoint (it is replaced)
    max_iters=9000,  # optimizer steps (Appendix B.1)
    global_batch_size=1024,  # sequences per optimizer step, over all ranks (Section 5.1)
    micro_batch_size=8,  # sequences per forward on one rank; accumulation steps are derived
    learning_rate=1e-3,  # Section 5.1 (swept 5e-4 ... 5e-3)
    min_lr=0.0,  # learning rate at the end of the decay
    warmup_iters=100,  # warmup-stable-decay schedule (Appendix B.1)
    decay_frac=0.2,  # the last 20% of the steps decay linearly to min_lr (the paper gives no number)
    weight_decay=0.1,  # Section 5.1
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # clip the global gradient norm (0: off); metrics log the norm before clipping
    seed=1337,
    eval_interval=500,  # evaluate, log attention statistics and save a checkpoint every this many steps
    eval_batches=20,  # validation batches of micro_batch_size sequences, split over ranks
    log_interval=10,  # console line every this many steps (metrics.jsonl gets every step)
    nonfinite='stop',  # non-finite loss/grad norm: 'stop' with an error, or 'skip' the step and count it
    device='auto',  # 'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...
    dtype='auto',  # 'auto' (bfloat16 autocast on GPUs that support it, else float32) | float32 | bfloat16
    compile=None,  # torch.compile; None: on for CUDA, off for CPU
    peak_flops=None,  # per-device peak FLOP/s for MFU; None: a table for known GPUs, else a measured matmul peak
    teacher=None,  # knowledge distillation from a teacher (a Hugging Face directory or one of our checkpoints)
    kd_temperature=1.0,
    kd_alpha=1.0,  # loss = kd_alpha * KD + (1 - kd_alpha) * CE; 1.0 is the paper's pure KD
    wandb_log=False,
    wandb_project='affine-scaled-attention',
    wandb_run_name=None,
    # FSDP2: shard the student's weights, gradients and AdamW state over the ranks (fully_shard, one group per
    # decoder layer); with bfloat16, layers are gathered and computed in bf16 from fp32 shards and gradients are
    # reduce-scattered in fp32. The teacher stays whole on every rank (inference only). Needs torchrun.
    fsdp=False,
    activation_checkpointing=False,  # keep only each decoder layer's input, recompute the layer in backward
    dry_run=False,  # build the model on the meta device, print parameter counts and the memory plan, exit
    dry_run_world_size=8,  # GPUs the dry run's per-GPU memory estimate assumes (a real run: torchrun's ranks)
    dry_run_gpu_gib=80.0,  # memory of one GPU, for the dry run's verdict on whether the config fits
)
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
# Keys whose default is None (or a dict) and the types they may also take; every other key takes the
# type of its default (an int is accepted where a float is expected).
NULLABLE = dict(compile=(bool,), peak_flops=(float, int), teacher=(str,), wandb_run_name=(str,), rope_scaling=(dict,))
CHOICES = dict(init_from=('auto', 'resume', 'scratch'), nonfinite=('stop', 'skip'),
               dtype=('auto', 'float32', 'bfloat16'))


def check_value(key, value, where):
    """The value, validated against the key's type (ints are widened to float); a clear error otherwise."""
    default = {**DEFAULTS, **MODEL_DEFAULTS}[key]
    allowed = NULLABLE[key] + (type(None),) if key in NULLABLE else (type(default),)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = ' or '.join(t.__name__ for t in allowed)
        raise SystemExit(f"{where}: {key}={value!r} has type {type(value).__name__}, expected {names}")
    if key in CHOICES and value not in CHOICES[key]:
        raise SystemExit(f"{where}: {key}={value!r}; valid values: {', '.join(CHOICES[key])}")
    return value


def load_config(argv):
    """Defaults <- config files <- --key=value overrides, each key checked."""
    config = {**DEFAULTS, **MODEL_DEFAULTS}
    valid = 'valid keys: ' + ', '.join(sorted(config))
    for arg in argv:
        if arg.startswith('--'):
            key, sep, text = arg[2:].partition('=')
            if not sep:
                raise SystemExit(f"{arg}: overrides are written --key=value")
            if key not in config:
                raise SystemExit(f"unknown config key {key!r} in {arg}; {valid}")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare word is a string: --attention=affine
            config[key] = check_value(key, value, arg)
        else:
            if not os.path.isfile(arg):
                raise SystemExit(f"config file {arg} not found")
            values = {}
            exec(open(arg).read(), {}, values)
            for key, value in values.items():
                if key not in config:
                    raise SystemExit(f"{arg}: unknown config key {key!r}; {valid}")
                config[key] = check_value(key, value, arg)
    return config


# -----------------------------------------------------------------------------------------------
# Schedule, checkpoints, measurements

def learning_rate(step, c):
    """Warmup-stable-decay: linear warmup, constant, then linear decay to min_lr over the last decay_frac."""
    if step < c['warmup_iters']:
        return c['learning_rate'] * (step + 1) / c['warmup_iters']
    decay_start = int(c['max_iters'] * (1 - c['decay_frac']))
    if step < decay_start:
        return c['learning_rate']
    progress = (step - decay_start) / max(1, c['max_iters'] - decay_start)
    return c['learning_rate'] + (c['min_lr'] - c['learning_rate']) * progress


# What may differ between a checkpoint's run and the run that continues it: nothing here changes what a step
# computes (the data of step s depends only on (seed, s, global_batch_size), not on the ranks or the micro-batch).
# max_iters may grow to extend a run; note that with decay_frac > 0 the decay then starts later than it would have.
# Every other training key, and the model, must be the same; data_dir may move, but must hold the same data.
RESUME_MAY_CHANGE = {'out_dir', 'data_dir', 'init_from', 'overwrite', 'max_iters', 'micro_batch_size', 'eval_interval',
                     'eval_batches', 'log_interval', 'nonfinite', 'device', 'compile', 'peak_flops', 'wandb_log',
                     'wandb_project', 'wandb_run_name', 'fsdp', 'activation_checkpointing', 'dry_run',
                     'dry_run_world_size', 'dry_run_gpu_gib'}


def check_resumable(ckpt, c, model_config, data_meta, path):
    """SystemExit listing everything that would make continuing the checkpoint `ckpt` with config `c` differ from the
    run that wrote it: the model, a training key outside RESUME_MAY_CHANGE, or the data (its tokenizer and size)."""
    if any(isinstance(key, int) for key in ckpt['optimizer']['state']):
        raise SystemExit(f"{path} keeps its optimizer state by parameter index (train.py before fsdp support); this "
                         f"train.py resumes checkpoints keyed by parameter name only")
    old = {**ckpt['config'], **ckpt['model_config']}
    new = {**c, **dataclasses.asdict(model_config)}
    changed = [f"{key}: {old[key]!r} -> {new[key]!r}" for key in sorted(new)
               if key in old and key not in RESUME_MAY_CHANGE and old[key] != new[key]]
    if 'data' in ckpt and ckpt['data'] != data_fingerprint(data_meta):
        changed.append(f"the data: {ckpt['data']} -> {data_fingerprint(data_meta)} (data_dir={c['data_dir']})")
    if changed:
        raise SystemExit(f"{path} was written by a different run; continuing it with these settings would not be the "
                         f"same run:\n  - " + "\n  - ".join(changed) + f"\nKeys that may change on resume: "
                         f"{', '.join(sorted(RESUME_MAY_CHANGE))}. To start a new run instead: another --out_dir, or "
                         f"--init_from=scratch --overwrite=True.")


def data_fingerprint(meta):
    """What identifies a prepare_data.py directory's contents (its meta.json): the tokenizer and each split's size."""
    return dict(tokenizer=meta['tokenizer']['sha256'],
                **{f'{split}_tokens': info['tokens'] for split, info in sorted(meta['splits'].items())})


def save_checkpoint(path, state):
    """Atomic: write a temp file, fsync, rename. A crash mid-save leaves the previous checkpoint intact."""
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def shard(model, dtype):
    """FSDP2 in place: one group per decoder layer (gathered just before its forward and its backward, freed
    after), the root group for the rest. bfloat16: gathered and computed in bf16 from the fp32 shards (the master
    weights), gradients reduce-scattered and accumulated in fp32. The root keeps its parameters gathered from
    forward to backward (FSDP's default for the root, stated here because the KD loss reads lm_head.weight after
    the forward)."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == 'bfloat16' \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)


def full_tensor(t):
    """A DTensor (an FSDP-sharded parameter, or a reduction over one) gathered whole; other tensors as they are.
    A collective under FSDP: every rank must call it."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def compile_layers(model):
    """torch.compile each decoder layer on its own, in place (nn.Module.compile), the way torchtitan does: one compiled
    graph serves every layer of a shape, so compiling takes seconds, not minutes; under DDP each layer's gradients are
    ready (and all-reduced in DDP's buckets) while the backward goes on through the layers below, which a single
    whole-model graph would only allow through DDP's graph splitting; and under FSDP2, whose per-layer hooks break any
    graph that spans layers, nothing falls back to eager. The rest (embeddings, final norm, lm_head, loss) runs eager."""
    for layer in model.model.layers:
        layer.compile()
    return model


def wrap_ddp(model, device):
    """DDP around the GPT, its gradients kept once: every .grad is created before DDP(...), which then turns them into
    views of its all-reduce buckets (gradient_as_bucket_view), and the loop zeroes them in place
    (zero_grad(set_to_none=False)), so the no_sync micro-steps accumulate into the buckets instead of a second set.
    Wrap after the optimizer state is loaded (torch.distributed.checkpoint initialises AdamW's state only while no
    .grad exists)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return DDP(model, device_ids=[device.index] if device.type == 'cuda' else None, gradient_as_bucket_view=True,
               **DDP_NO_BUFFER_SYNC)


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


def accumulate_gradients(model, student, teacher, batches, accumulation, c, autocast, ddp, teacher_timer=None):
    """Forward and backward of one optimizer step's micro-batches on this rank, `batches` yielding (x, y) on the
    device; the gradients of the mean loss are left in .grad. model: the module to call (compiled / DDP / FSDP),
    student: the GPT itself (its lm_head for the KD loss); teacher: None (cross-entropy) or a GPT in eval mode.
    Returns the sums over micro-batches of (loss, KD, CE), one device tensor to read once per step (no host sync)."""
    from distill import fused_kd_loss
    sums = None
    for micro, (x, y) in enumerate(batches):
        # DDP all-reduces the gradients only in the backward of the last micro-step. FSDP reduce-scatters every
        # micro-step: only the sharded gradients are kept between micro-steps
        with model.no_sync() if ddp and micro < accumulation - 1 else nullcontext():
            with autocast:
                if teacher is None:
                    _, loss = model(x, y)
                    logged = torch.stack([loss.detach(), loss.detach().new_zeros(()), loss.detach().new_zeros(())])
                else:
                    with teacher_timer() if teacher_timer else nullcontext(), torch.no_grad():
                        teacher_hidden, _ = teacher(x, return_hidden=True)
                    hidden, _ = model(x, return_hidden=True)
                    loss, kd, ce = fused_kd_loss(hidden, student.lm_head.weight, teacher_hidden,
                                                 teacher.lm_head.weight, temperature=c['kd_temperature'],
                                                 targets=y, kd_alpha=c['kd_alpha'])
                    logged = torch.stack([loss.detach(), kd, ce])
            (loss / accumulation).backward()
        sums = logged.float() if sums is None else sums + logged
    return sums


def rng_state():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state):
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if state['cuda'] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


@torch.no_grad()
def mean_attention_logit(model, idx):
    """Mean of q_i.k_j/sqrt(d) over layers, heads and causal pairs j <= i (paper Figure 2), and of its
    absolute value, on one sequence. Uses the model's own q/k projections, inside each layer's forward (where
    FSDP has gathered the layer's weights); the T x T logits are built one layer at a time for this one
    sequence only. Under FSDP every rank must call it."""
    stats = []  # (signed, absolute) per layer

    def record(attn, args):
        q, k, _ = attn.project(*args[:3])  # x, cos, sin
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
        visible = logits[..., torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device).tril()]
        stats.append(torch.stack([visible.mean(), visible.abs().mean()]))

    hooks = [layer.self_attn.register_forward_pre_hook(record) for layer in model.model.layers]
    was_training = model.training
    model.eval()  # eval mode: affine must not count this sequence in alpha_ma's next update
    try:
        model(idx[:1])
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    signed, absolute = zip(*torch.stack(stats).tolist())  # one transfer from the device
    return sum(signed) / len(signed), sum(absolute) / len(absolute)


def reduce_mean(values, device):
    """The mean over ranks of a few numbers (a list of floats or a tensor), with one all_reduce."""
    t = torch.as_tensor(values, dtype=torch.float64, device=device).clone()
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.tolist()


@torch.no_grad()
def evaluate(model, val_data, c, device, autocast):
    """Mean validation loss per token over eval_batches batches of micro_batch_size windows, split over ranks.
    Every rank runs equally many forwards (FSDP's all-gathers are collective); the padding ones are not counted."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    for b in range(rank, math.ceil(c['eval_batches'] / world) * world, world):
        first = b * c['micro_batch_size']
        indices = [i % len(val_data) for i in range(first, first + c['micro_batch_size'])]
        x, y = (torch.from_numpy(t).to(device) for t in val_data.get(indices))
        with autocast:
            _, loss = model(x, y)
        if b < c['eval_batches']:
            total += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64, device=device)
    model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def attention_stats(model, alpha_means):
    """Per-layer head means of this step's E[alpha] and of alpha_ma (affine), or of the sink logits (sink)."""
    layers = [layer.self_attn for layer in model.model.layers]
    stats = {}
    if alpha_means:
        stats['alpha_mean'] = [round(a.mean().item(), 5) for a in alpha_means]
    if hasattr(layers[0], 'alpha_ma'):
        stats['alpha_ma'] = [round(m.alpha_ma.mean().item(), 5) for m in layers]
    if hasattr(layers[0], 'sinks'):  # a parameter: under FSDP a shard, gathered (every rank calls this)
        stats['sinks'] = [round(full_tensor(m.sinks).mean().item(), 5) for m in layers]
    return stats


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


# -----------------------------------------------------------------------------------------------
# Memory plan: what one GPU holds at the peak of a training step, before launching

# The paper's teachers, as their Hugging Face config.json gives them (notes/reference_facts.md, section 2): a dry
# run sizes the teacher from these when its checkpoint is not on this machine.
KNOWN_TEACHERS = {
    'Qwen1.5-1.8B': dict(n_layer=24, n_head=16, n_kv_head=16, n_embd=2048, intermediate_size=5504,
                         vocab_size=151936, qkv_bias=True),
    'Llama-3.2-3B': dict(n_layer=28, n_head=24, n_kv_head=8, n_embd=3072, intermediate_size=8192,
                         vocab_size=128256, tie_embeddings=True),
    'Llama-3.1-8B': dict(n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, intermediate_size=14336,
                         vocab_size=128256),
}


def teacher_shape(spec):
    """(ModelConfig or None, where it came from) of a teacher, without reading its weights: the checkpoint's
    config if it is here, else KNOWN_TEACHERS by the directory's name, else None."""
    from distill import checkpoint_file, config_from_hf, read_checkpoint
    if os.path.exists(spec):
        path = checkpoint_file(spec)
        if path is None:
            with open(os.path.join(spec, 'config.json')) as f:
                return config_from_hf(json.load(f)), spec
        return ModelConfig(**read_checkpoint(path)['model_config']), path
    name = os.path.basename(os.path.normpath(spec))
    if name in KNOWN_TEACHERS:
        return ModelConfig(**KNOWN_TEACHERS[name]), f"{name}'s published shape (no checkpoint at {spec})"
    return None, (f"unknown (no checkpoint at {spec}, and not one of {', '.join(KNOWN_TEACHERS)}): teacher and KD "
                  f"terms left out, estimated as training without a teacher")


def memory_estimate(cfg, world, micro_batch, dtype, fsdp, activation_checkpointing, teacher=None):
    """Bytes one GPU holds at the peak of a training step, by component, for the student cfg (a ModelConfig),
    `world` ranks, micro_batch sequences of cfg.block_size tokens per forward, dtype 'float32' | 'bfloat16' (the
    autocast / FSDP compute dtype) and the teacher's ModelConfig (None: plain cross-entropy). Components peak at
    nearly the same moment (end of forward, start of backward), so their sum slightly overestimates the peak.
    Not counted: the CUDA context, NCCL buffers and allocator fragmentation (leave ~10% of the GPU for them).
      weights      DDP: fp32 (4 B/param), plus autocast's bf16 copies of the layers' matrices, which autograd
                   keeps for backward. FSDP: fp32 shards (4/world), plus the gathered (compute-dtype) root group
                   (embeddings, final norm, untied lm_head: gathered from forward to the end of backward) and
                   two decoder layers (the one computing and the one prefetched).
      gradients    held from the first micro-step's backward to the optimizer step. DDP: fp32, once: the .grad
                   tensors are views of DDP's all-reduce buckets (wrap_ddp; gradients created afresh by the no_sync
                   micro-steps would be a second copy beside the buckets). FSDP: fp32 shards, plus the root's unsharded
                   gradients and one layer's, with that layer's fp32 reduce-scatter input.
      optimizer    AdamW's exp_avg and exp_avg_sq, fp32 (8 B/param; FSDP: 8/world).
      teacher      its weights in the compute dtype, whole on every rank, and its output hidden states. (Its
                   no-grad forward's intermediates are gone before the student's forward starts.)
      activations  what autograd saves per token and decoder layer, counted tensor by tensor for this model
                   (saved_tensors_hooks; tests/test_fsdp.py checks the count): the two RMSNorms, q/k/v, the
                   attention output and log-sum-exp, the variant's extras, the SwiGLU MLP; plus one layer's worth
                   of gradients in flight during backward. Activation checkpointing keeps only each layer's input
                   and holds one recomputed layer and its gradients at a time.
      kd_loss      distill.fused_kd_loss's working set, tensor by tensor (distill.kd_loss_memory): its bf16 GEMMs'
                   float32 logits for one chunk of tokens, the float32 gradient of the student's lm_head and the
                   gradient of its hidden states (kept from forward to backward), the student head's bf16 copy
                   (DDP's fp32 master), none of the bf16 teacher's head.
                   Without a teacher: the full logits, their float copy, log-softmax and gradient."""
    from distill import kd_loss_memory
    with torch.device('meta'):
        student = GPT(cfg)
    n_params = student.get_num_params()
    per_layer = sum(p.numel() for p in student.model.layers[0].parameters())
    root = n_params - cfg.n_layer * per_layer  # FSDP's root group: embeddings, final norm, untied lm_head
    a = 4 if dtype == 'float32' else 2  # bytes of a compute-dtype element
    N = micro_batch * cfg.block_size  # tokens per forward
    if fsdp:
        weights = 4 * n_params / world + a * (root + 2 * per_layer)
        grads = 4 * n_params / world + a * root + (a + 4) * per_layer
    else:
        weights = 4 * n_params + (2 * cfg.n_layer * per_layer if dtype == 'bfloat16' else 0)
        grads = 4 * n_params

    C, I, H = cfg.n_embd, cfg.intermediate_size, cfg.n_head
    HD, KVD = H * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    affine, gated = cfg.attention in ('affine', 'affine_gated'), cfg.attention in ('gated', 'affine_gated')
    if dtype == 'float32':  # each RMSNorm keeps its input, normalised input and output (read by the linears)
        norms = 2 * (12 * C + 4)
    elif fsdp:  # bf16 weights: the input's fp32 upcast, then normalised and output in bf16
        norms = 2 * (8 * C + 4)
    else:  # fp32 weights under autocast: fp32 input and normalised; every linear keeps its own bf16 input copy
        norms = 2 * (8 * C + 4) + 2 * C * (5 + affine + gated)
    # k and v as the kernels save them: grouped in bf16 (flash takes GQA), repeated to every head in float32 on CUDA
    # (the memory-efficient kernel does not; model.kv_for_kernel)
    kv = 2 * (HD if dtype == 'float32' else KVD)
    layer = (norms + a * (3 * HD + kv) + 4 * H  # q, attention output, o_proj's input, k, v; fp32 log-sum-exp
             + gated * 2 * a * HD  # the gate's input and its sigmoid
             + affine * (12 * H + 4 * KVD)  # alpha (fp32) and its views, the running mean of V (fp32)
             + 4 * a * I)  # SwiGLU: gate and up outputs, silu, down_proj's input
    layer_input = 2 * C if dtype == 'bfloat16' and fsdp else 4 * C  # the residual stream: fp32 but under FSDP bf16
    if activation_checkpointing:
        activations = N * (cfg.n_layer * layer_input + 2 * layer)
    else:
        activations = N * (cfg.n_layer + 1) * layer
    activations += N * (8 * C + 4)  # the final RMSNorm

    estimate = dict(weights=weights, gradients=grads, optimizer=8 * n_params / (world if fsdp else 1))
    V = cfg.vocab_size
    if teacher is not None:
        with torch.device('meta'):
            teacher_params = GPT(teacher).get_num_params()
        estimate['teacher'] = a * teacher_params + N * a * teacher.n_embd  # + its output, kept for the loss
        compute = torch.float32 if a == 4 else torch.bfloat16  # the GEMMs' dtype: autocast's, or float32
        student_side = torch.bfloat16 if fsdp and a == 2 else torch.float32  # FSDP gathers bf16; DDP: fp32 masters
        estimate['kd_loss'] = kd_loss_memory(N, V, C, teacher.n_embd, compute, student_weight_dtype=student_side,
                                             hidden_dtype=student_side, device_type='cuda')
    else:
        estimate['loss'] = N * V * (12 + (4 if a == 2 else 0))
    estimate['activations'] = activations
    return estimate


def print_memory_plan(c, model_config):
    """The dry run's table: memory_estimate for this config, dry_run_world_size GPUs, its micro-batch."""
    world, gpu_gib = c['dry_run_world_size'], c['dry_run_gpu_gib']
    if world < 1 or gpu_gib <= 0:
        raise SystemExit(f"dry_run_world_size={world} must be >= 1 and dry_run_gpu_gib={gpu_gib} > 0")
    dtype = 'bfloat16' if c['dtype'] == 'auto' else c['dtype']  # auto is bfloat16 on the GPUs this plans for
    teacher, source = teacher_shape(c['teacher']) if c['teacher'] else (None, 'none (cross-entropy)')
    estimate = memory_estimate(model_config, world, c['micro_batch_size'], dtype, c['fsdp'],
                               c['activation_checkpointing'], teacher)
    total = sum(estimate.values()) / 2 ** 30
    verdict = ('fits' if total <= 0.9 * gpu_gib else 'tight: under 10% left for the CUDA context, NCCL and '
               'fragmentation' if total <= gpu_gib else 'does not fit')
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])
    steps = (f"{accumulation} micro-steps" if accumulation and not rest else f"global_batch_size="
             f"{c['global_batch_size']} is not a multiple of {world} x {c['micro_batch_size']}: a run would stop")
    print(f"memory per GPU, estimated: {'FSDP' if c['fsdp'] else 'DDP'} on {world} GPUs, micro_batch_size="
          f"{c['micro_batch_size']} x {model_config.block_size} tokens ({steps}), {dtype}, "
          f"activation_checkpointing={c['activation_checkpointing']}; teacher: {source}")
    for name, value in estimate.items():
        print(f"  {name:<12} {value / 2 ** 30:7.2f} GiB")
    print(f"  {'total':<12} {total:7.2f} GiB of {gpu_gib:g}: {verdict}")


# -----------------------------------------------------------------------------------------------

def main(argv):
    c = load_config(argv)
    try:
        model_config = ModelConfig(**{k: c[k] for k in FIELD_NAMES})
    except ValueError as e:  # ModelConfig's own checks (variant names, head counts, rope_scaling)
        raise SystemExit(f"config: {e}")
    if c['dry_run']:
        with torch.device('meta'):
            model = GPT(model_config)
        total = model.get_num_params()
        embedding = model.model.embed_tokens.weight.numel()
        if not model_config.tie_embeddings:
            embedding += model.lm_head.weight.numel()
        print(f"params: total={total} non_embedding={total - embedding} "
              f"attention_extra={model.get_num_params(variant_only=True)}")
        print_memory_plan(c, model_config)
        return

    # --- distributed setup (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK) ---
    distributed = 'RANK' in os.environ  # DDP, or FSDP with fsdp=True
    if c['fsdp'] and not distributed:
        raise SystemExit("fsdp=True shards the model over the ranks torchrun starts: launch with torchrun "
                         "--nproc_per_node=N train.py ... (N=1 works), or drop --fsdp=True for one process")
    rank, world = (int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])) if distributed else (0, 1)
    if c['device'] == 'auto':
        c['device'] = 'cuda' if torch.cuda.is_available() else 'cpu'
    device = torch.device(c['device'])
    if distributed and device.type == 'cuda':
        device = torch.device('cuda', int(os.environ['LOCAL_RANK']))
        torch.cuda.set_device(device)
    if distributed:
        init_distributed('nccl' if device.type == 'cuda' else 'gloo')
    master = rank == 0
    if c['dtype'] == 'auto':
        c['dtype'] = 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if c['dtype'] == 'bfloat16' else nullcontext()
    if c['compile'] is None:
        c['compile'] = device.type == 'cuda'
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])  # micro-steps per rank
    if rest or accumulation == 0:
        raise SystemExit(f"global_batch_size={c['global_batch_size']} must be a multiple of world size ({world}) "
                         f"x micro_batch_size ({c['micro_batch_size']})")

    # --- data, checked against the model before step 0 ---
    data_meta = read_meta(c['data_dir'])
    if data_meta['vocab_size'] > model_config.vocab_size:
        raise SystemExit(f"data_dir={c['data_dir']} was tokenized with {data_meta['vocab_size']} token ids but the "
                         f"model has vocab_size={model_config.vocab_size}")
    train_data = Windows(c['data_dir'], 'train', model_config.block_size)
    val_data = Windows(c['data_dir'], 'val', model_config.block_size)

    # --- model, optimizer, resume ---
    os.makedirs(c['out_dir'], exist_ok=True)
    ckpt_path = os.path.join(c['out_dir'], 'ckpt.pt')
    torch.manual_seed(c['seed'])
    model = GPT(model_config).to(device)  # whole on every rank first: FSDP then starts from DDP's initial weights
    for layer in model.model.layers:
        layer.activation_checkpointing = c['activation_checkpointing']
    start_step, ckpt = 0, None
    exists = os.path.isfile(ckpt_path)
    if c['init_from'] == 'resume' and not exists:
        raise SystemExit(f"init_from=resume: no checkpoint at {ckpt_path}")
    if exists:
        # memory-mapped: the ranks of a node share one copy in the page cache, and nothing lands on the GPU
        ckpt = torch.load(ckpt_path, map_location='cpu', mmap=True, weights_only=False)
        if c['init_from'] == 'scratch' and not c['overwrite']:
            raise SystemExit(f"{ckpt_path} holds a run at step {ckpt['step']}, which init_from=scratch would replace at "
                             f"its first save. To continue it: --init_from=auto (the default). To start over and "
                             f"replace it: --init_from=scratch --overwrite=True. Or choose another --out_dir.")
        if c['init_from'] == 'scratch':
            ckpt = None
    if ckpt is not None:
        check_resumable(ckpt, c, model_config, data_meta, ckpt_path)
        model.load_state_dict(ckpt['model'])  # full tensors, before any sharding
    if master:  # the first line of every run says how it started
        print(f"init_from={c['init_from']}: " + (f"resuming from {ckpt_path} at step {ckpt['step']}" if ckpt is not None
              else f"starting fresh{' (replacing ' + ckpt_path + ')' if exists else ''}"), flush=True)
    if c['compile']:
        compile_layers(model)
    if c['fsdp']:
        shard(model, c['dtype'])
    optimizer = model.configure_optimizers(c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']))
    if ckpt is not None:  # the full state, keyed by parameter name; under FSDP each rank keeps its shard
        set_optimizer_state_dict(model, optimizer, ckpt['optimizer'], options=StateDictOptions(full_state_dict=True))
        start_step = ckpt['step']
        set_rng_state(ckpt['rng'])
        del ckpt
    ddp = distributed and not c['fsdp']
    raw_model = model  # the GPT itself (the optimizer's, the checkpoint's, the KD loss's); `model` is what the loop calls
    if ddp:
        model = wrap_ddp(model, device)
    save_group = None
    if distributed:  # rank 0 may write a checkpoint of tens of GB to slow storage while the others wait: they wait in
        # a gloo barrier with a long timeout, with no NCCL collective pending that the watchdog would time out
        save_group = dist.new_group(backend='gloo', timeout=SAVE_TIMEOUT)

    teacher = None
    if c['teacher']:
        from distill import check_compatibility, load_teacher
        teacher = load_teacher(c['teacher'], device, torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32)
        check_compatibility(teacher, c['teacher'], model_config, data_meta, model_config.block_size)
        if c['compile']:
            compile_layers(teacher)

    peak_flops = c['peak_flops'] or default_peak_flops(device, torch.bfloat16 if c['dtype'] == 'bfloat16'
                                                       else torch.float32)
    if master:
        with open(os.path.join(c['out_dir'], 'config.json'), 'w') as f:
            json.dump(c, f, indent=1)
        print(f"GPT: {raw_model.get_num_params():,} parameters, attention={model_config.attention}; {world} rank(s) x "
              f"{accumulation} micro-steps x {c['micro_batch_size']} sequences x {model_config.block_size} tokens; "
              f"{'FSDP' if c['fsdp'] else 'DDP' if distributed else 'one process'}, {device}, {c['dtype']}"
              f"{', activation checkpointing' if c['activation_checkpointing'] else ''}; "
              f"{len(train_data):,} train windows")
        if c['wandb_log']:
            import wandb
            wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)
    if master:  # on resume keep the records up to the checkpoint's step (a crash may have left later ones)
        metrics_path = os.path.join(c['out_dir'], 'metrics.jsonl')
        kept = []
        if start_step and os.path.isfile(metrics_path):
            kept = [line for line in open(metrics_path) if json.loads(line)['step'] <= start_step]
        with open(metrics_path, 'w') as f:
            f.writelines(kept)

    # --- the loop ---
    skipped, alpha_means = 0, []
    teacher_timer = DeviceTimer(device)  # the teacher's forward time, logged apart from the student's
    batch = c['micro_batch_size']
    tokens_per_step = c['global_batch_size'] * model_config.block_size
    model.train()
    step = start_step
    with preemption_flag() as stop_signal:
        while step < c['max_iters']:
            t0 = time.perf_counter()
            lr = learning_rate(step, c)
            for group in optimizer.param_groups:
                group['lr'] = lr
            # this rank's part of the global batch, then its micro-batches
            mine = train_data.step_indices(c['seed'], step, c['global_batch_size'])[rank * accumulation * batch:]
            batches = (batch_to_device(train_data.get(mine[micro * batch:(micro + 1) * batch]), device)
                       for micro in range(accumulation))
            sums = accumulate_gradients(model, raw_model, teacher, batches, accumulation, c, autocast, ddp,
                                        teacher_timer)
            # the raw norm before clipping (paper Tables 4-5); grad_clip=0 only measures it
            grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(raw_model.parameters(),
                                                                   c['grad_clip'] or math.inf)).item()
            loss_mean, kd_mean, ce_mean = reduce_mean(sums / accumulation, device)
            if math.isfinite(loss_mean) and math.isfinite(grad_norm):
                optimizer.step()
                alpha_means = raw_model.update_alpha_ma()  # Eq. 9 with this step's global batch
            elif c['nonfinite'] == 'stop':
                raise SystemExit(f"step {step}: non-finite loss ({loss_mean}) or gradient norm ({grad_norm}); "
                                 f"stopping (nonfinite='skip' skips such steps instead)")
            else:
                skipped += 1
                alpha_means = raw_model.update_alpha_ma(discard=True)
            optimizer.zero_grad(set_to_none=not ddp)  # DDP: in place, the gradients are its buckets
            dt = time.perf_counter() - t0
            step += 1

            record = dict(step=step, lr=lr, loss=loss_mean, grad_norm=grad_norm, tokens_per_sec=tokens_per_step / dt,
                          mfu=raw_model.estimate_mfu(c['global_batch_size'] / world, dt, peak_flops), dt=dt)
            if device.type == 'cuda':  # this rank's allocator peak so far, to hold against the dry run's estimate
                record['peak_memory_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
            if teacher is not None:
                record.update(kd_loss=kd_mean, ce_loss=ce_mean, teacher_sec=teacher_timer.seconds())
            if c['nonfinite'] == 'skip':
                record['skipped_steps'] = skipped
            if step % c['eval_interval'] == 0 or step == c['max_iters']:
                record['val_loss'] = evaluate(model, val_data, c, device, autocast)
                record['val_ppl'] = math.exp(min(record['val_loss'], 50))
                with autocast:
                    record['attn_logit_mean'], record['attn_logit_abs_mean'] = mean_attention_logit(
                        raw_model, torch.from_numpy(val_data.get([0])[0]).to(device))
                record.update(attention_stats(raw_model, alpha_means))
            if master:
                with open(metrics_path, 'a') as f:
                    f.write(json.dumps(record) + '\n')
                if c['wandb_log']:
                    wandb.log(record, step=step)
                if step % c['log_interval'] == 0 or 'val_loss' in record:
                    val = f" | val {record['val_loss']:.4f}" if 'val_loss' in record else ''
                    print(f"step {step}/{c['max_iters']} | loss {loss_mean:.4f}{val} | lr {lr:.2e} | "
                          f"grad {grad_norm:.3f} | {record['tokens_per_sec']:,.0f} tok/s | "
                          f"mfu {100 * record['mfu']:.2f}% | {1000 * dt:.0f} ms", flush=True)
            stop = reduce_mean([float(bool(stop_signal))], device)[0] > 0  # all ranks stop at the same step
            if 'val_loss' in record or stop:
                # full tensors on rank 0's CPU, keyed by name (every rank takes part in gathering FSDP's shards)
                options = StateDictOptions(full_state_dict=True, cpu_offload=True)
                model_state = get_model_state_dict(raw_model, options=options)
                optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
                if master:
                    save_checkpoint(ckpt_path, dict(
                        model=model_state, optimizer=optimizer_state, step=step, rng=rng_state(), config=c,
                        model_config=dataclasses.asdict(model_config), tokenizer=data_meta['tokenizer'],
                        data=data_fingerprint(data_meta)))
                del model_state, optimizer_state
                if distributed:
                    dist.barrier(group=save_group)
            if stop:
                if master:
                    print(f"stopped by a signal: saved {ckpt_path} at step {step}; the same command continues it",
                          flush=True)
                break
    if distributed:
        dist.destroy_process_group()

if __name__ == '__main__':
    main(sys.argv[1:])
