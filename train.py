"""
Train a student with the paper's recipe (Section 5.1, Appendix B.1), on one CPU or many GPUs.

    python train.py config/tiny_cpu.py --data_dir=data/builtin_bytes --max_iters=200  # a CPU
    torchrun --standalone --nproc_per_node=8 train.py config/affine_1b.py  # 8 GPUs, DDP
    python train.py config/affine_3b.py --dry_run=True  # parameter counts, memory plan per GPU

Reading order: train, at the bottom, is the loop as nanoGPT writes it (forward, loss, backward,
clip, step, log, eval, save); main checks everything before writing. The keys: lmkit/runs.py.
"""
import dataclasses
import hashlib
import json
import math
import os
import statistics
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import lmkit  # noqa: F401  (first: it makes idle OpenMP threads sleep, lmkit/__init__.py)
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict)

from distill import check_compatibility, compute_loss, load_teacher
from lmkit.data import Windows, first_token_id, read_meta
from lmkit.distributed import (apply_fsdp, batch_to_device, check_cpu_compiler, compile_layers,
                               full_tensor, init_distributed, local_tensor, preemption_flag,
                               reduce_mean, resolve_device, resolve_dtype, wrap_ddp)
from lmkit.errors import RunError, print_or_stop, run_script, stopped_after_save
from lmkit.measure import DeviceTimer, default_peak_flops, estimate_mfu, gemm_shapes
from lmkit.progress import duration
from lmkit.probes import mean_attention_logit, sink_record, variant_tensor_means
from lmkit.runs import (checkpoint_path, claim_out_dir, configure_optimizers, dry_run, hold_out_dir,
                        load_config, resume_point, save_run_checkpoint, set_rng_state, start_log)
from model import FIELD_NAMES, GPT, ModelConfig

SAVE_TIMEOUT = timedelta(hours=2)  # how long ranks wait for rank 0's save (NCCL's default: 10 min)

# -----------------------------------------------------------------------------------------------
# Schedule

def learning_rate(step, c):
    """Warmup-stable-decay: linear warmup, constant, linear decay to min_lr (last decay_frac)."""
    if step < c['warmup_iters']:
        return c['learning_rate'] * (step + 1) / c['warmup_iters']
    decay_start = int(c['max_iters'] * (1 - c['decay_frac']))
    if step < decay_start:
        return c['learning_rate']
    progress = (step - decay_start) / max(1, c['max_iters'] - decay_start)
    return c['learning_rate'] + (c['min_lr'] - c['learning_rate']) * progress


# -----------------------------------------------------------------------------------------------
# Checks beyond the keys' ranges: settings against the data before any work, weights before a save

def validation_batches(c, val_data):
    """The batches an evaluation reads: eval_batches, but at most one pass over the val split."""
    return min(c['eval_batches'], math.ceil(len(val_data) / c['micro_batch_size']))


def check_sizes(c, train_data, val_data):
    """RunError where a step's batch or attention_windows asks a split for more than it holds."""
    where, tokens = f"of data_dir={c['data_dir']}", c['block_size']
    if c['global_batch_size'] > len(train_data):
        raise RunError(f"global_batch_size={c['global_batch_size']:,}: the train split {where} "
                       f"holds {len(train_data):,} windows of {tokens} tokens, and one step would "
                       f"read some of them more than once; give at most {len(train_data):,}, or "
                       "prepare more data")
    if c['attention_windows'] > len(val_data):
        raise RunError(f"attention_windows={c['attention_windows']:,}: the val split {where} holds "
                       f"{len(val_data):,} windows of {tokens} tokens; give at most "
                       f"{len(val_data):,}")


def start_notes(c, val_data):
    """The lines a run starts with where its settings do not do what they say."""
    notes, batches = [], validation_batches(c, val_data)
    if batches < c['eval_batches']:
        notes.append(f"note: eval_batches={c['eval_batches']:,} x "
                     f"micro_batch_size={c['micro_batch_size']} is more than the {len(val_data):,} "
                     f"windows the val split of data_dir={c['data_dir']} holds: each evaluation "
                     f"reads {batches} batch{'es' * (batches > 1)}, every window once")
    if c['warmup_iters'] > c['max_iters']:  # allowed: a short test of a long run's config
        notes.append(f"warning: warmup_iters={c['warmup_iters']} is longer than "
                     f"max_iters={c['max_iters']}: the learning rate never reaches "
                     f"learning_rate={c['learning_rate']:g}, only "
                     f"{c['max_iters'] / c['warmup_iters']:.0%} of it at the last step")
    return notes


def nonfinite_weights(model, device):
    """(names, count) of the state-dict tensors holding NaN or inf, of count float tensors, alike
    on every rank: a tensor's largest magnitude (one fused _foreach_norm) is finite when it is."""
    named = [(n, local_tensor(t)) for n, t in model.state_dict().items() if t.is_floating_point()]
    bad = torch.zeros(len(named), device=device)
    held = [i for i, (_, t) in enumerate(named) if t.numel()]  # an empty shard has no maximum
    if held:
        norms = torch._foreach_norm([named[i][1] for i in held], math.inf)
        bad[held] = torch.stack([n.float() for n in norms]).isfinite().logical_not().float()
    bad = reduce_mean(bad, device)
    return [name for (name, _), flag in zip(named, bad) if flag > 0], len(named)


def check_step_finite(step, record, model, device, ckpt_path, saved):
    """RunError (on every rank alike) where the weights or the evaluation's loss are not finite:
    out_dir keeps the last good step's checkpoints (saved: its step, or None)."""
    bad, count = nonfinite_weights(model, device)
    if bad:
        what = (f"the weights are not finite after the optimizer step: {len(bad)} of the model's "
                f"{count} float tensors hold NaN or infinity, the first {bad[0]}")
    elif not math.isfinite(record.get('val_loss', 0.0)):
        what = f"the validation loss is {record['val_loss']} (the weights are finite)"
    else:
        return
    kept = (f"out_dir's checkpoints are left as they were ({ckpt_path}: step {saved}). To continue "
            "from it with a lower learning rate: --learning_rate=<lower> "
            "--resume_lr_change=True" if saved else
            "this run saved no checkpoint before it; start again with a lower --learning_rate")
    raise RunError(f"step {step}: {what}; stopping without saving: {kept}")


# -----------------------------------------------------------------------------------------------
# What a step computes and what an evaluation measures

EVAL_STOP_EVERY = 4  # validation batches between looks at the stop signal (a collective sync)


@torch.no_grad()
def validation_loss(model, val_data, c, device, autocast, stop=()):
    """Mean validation loss per token over validation_batches batches, split over ranks (each runs
    equally many forwards: FSDP's all-gathers are collective). None where `stop` fills meanwhile."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    batches = validation_batches(c, val_data)
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    model.eval()
    try:
        for n, b in enumerate(range(rank, math.ceil(batches / world) * world, world)):
            if n % EVAL_STOP_EVERY == 0 and reduce_mean([float(bool(stop))], device)[0] > 0:
                return None
            first = b * c['micro_batch_size']
            indices = [i % len(val_data) for i in range(first, first + c['micro_batch_size'])]
            x, y = batch_to_device(val_data.get(indices), device)
            with autocast:
                _, loss = model(x, y)
            if b < batches:  # summed on the device: no host sync per batch
                total[0] += loss.double() * y.numel()
                total[1] += y.numel()
    finally:
        model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def evaluation_record(c, run, model, raw_model, val_data, alpha_means, stop=()):
    """Validation loss and perplexity, the mean attention logit (Figure 2), the variant's and, with
    attention_windows, the sink's statistics; every rank takes part. Empty if a signal cut it."""
    val_loss = validation_loss(model, val_data, c, run.device, run.autocast, stop)
    if val_loss is None:
        return {}
    record = dict(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50)))
    with run.autocast:
        record['attn_logit_mean'], record['attn_logit_abs_mean'] = mean_attention_logit(
            raw_model, batch_to_device(val_data.get([0]), run.device)[0])
        if c['attention_windows']:  # the same windows at every evaluation
            windows = val_data.get(range(c['attention_windows']))
            record |= sink_record(raw_model, batch_to_device(windows, run.device)[0])
    return record | variant_tensor_means(raw_model, alpha_means)


# -----------------------------------------------------------------------------------------------
# The records: out_dir/metrics.jsonl (every step), the console, wandb; rank 0 alone writes

def import_wandb():
    """The wandb module, imported before anything is written."""
    try:
        import wandb
    except ImportError:
        raise RunError("wandb_log=True needs the wandb package, which is not installed: pip "
                       "install wandb (then wandb login), or --wandb_log=False") from None
    return wandb


class Metrics:
    """Where rank 0 writes the records: metrics.jsonl (every step, and events), the console (every
    log_interval steps and evaluation) and wandb (the module, or None)."""

    def __init__(self, c, run, start_step, wandb=None):
        self.c, self.on, self.wandb, self.stop = c, run.master, wandb, []  # stop: stdout closed
        self.dts = []  # the steps' times since the last console line: its ETA
        if not self.on:
            return
        self.path = start_log(c, start_step)
        if wandb:
            wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)

    def write(self, record):
        if not self.on:
            return
        with open(self.path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        if 'event' in record:
            return
        if self.wandb:
            self.wandb.log(record, step=record['step'])
        self.dts.append(record['dt'])
        if record['step'] % self.c['log_interval'] == 0 or 'val_loss' in record:
            val = f" | val {record['val_loss']:.4f}" if 'val_loss' in record else ''
            left = (self.c['max_iters'] - record['step']) * statistics.fmean(self.dts)
            self.dts = []
            print_or_stop(f"step {record['step']}/{self.c['max_iters']} | loss {record['loss']:.4f}"
                          f"{val} | lr {record['lr']:.2e} | grad {record['grad_norm']:.3f} | "
                          f"{record['tokens_per_sec']:,.0f} tok/s | mfu {100 * record['mfu']:.2f}%"
                          f" | {1000 * record['dt']:.0f} ms | ETA {duration(left)}", self.stop)


# -----------------------------------------------------------------------------------------------
# The run: setup, logging, checkpoints, the loop

@dataclasses.dataclass
class Run:
    """Where this process trains: its rank among `world`, its device, and what follows from them."""
    rank: int
    world: int
    device: torch.device
    distributed: bool  # under torchrun: DDP, or FSDP with fsdp=True
    ddp: bool
    accumulation: int  # micro-steps per optimizer step on this rank
    autocast: object  # the forward's context: bf16 autocast or nothing
    save_group: object = None  # gloo, for the barrier after a save (SAVE_TIMEOUT)

    @property
    def master(self):
        return self.rank == 0


def setup_run(c):
    """Ranks (torchrun's RANK, WORLD_SIZE, LOCAL_RANK), the device, the config's 'auto' resolved."""
    distributed = 'RANK' in os.environ
    if c['fsdp'] and not distributed:
        raise RunError("fsdp=True shards the model over the ranks torchrun starts: launch with "
                       "torchrun --nproc_per_node=N train.py ... (N=1 works), or drop --fsdp=True "
                       "for one process")
    rank, world = 0, 1
    if distributed:
        rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    device = resolve_device(c['device'])
    c['device'] = str(device)
    if distributed and device.type == 'cuda':
        device = torch.device('cuda', int(os.environ['LOCAL_RANK']))
        torch.cuda.set_device(device)
    save_group = None
    if distributed:
        init_distributed('nccl' if device.type == 'cuda' else 'gloo')
        # the others wait for rank 0's save in a gloo barrier: no NCCL watchdog to time out
        save_group = dist.new_group(backend='gloo', timeout=SAVE_TIMEOUT)
    c['dtype'] = resolve_dtype(c['dtype'], device)
    if c['compile'] is None:
        c['compile'] = device.type == 'cuda'
    if c['compile'] and device.type == 'cpu':
        check_cpu_compiler()
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])
    if rest or accumulation == 0:
        raise RunError(f"global_batch_size={c['global_batch_size']} must be a multiple of world "
                       f"size ({world}) x micro_batch_size ({c['micro_batch_size']})")
    bf16 = c['dtype'] == 'bfloat16'
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    return Run(rank, world, device, distributed, distributed and not c['fsdp'], accumulation,
               autocast, save_group)


def load_data(c, model_config):
    """(meta.json, train windows, val windows) of data_dir, checked against the model."""
    meta = read_meta(c['data_dir'])
    if meta['vocab_size'] > model_config.vocab_size:
        raise RunError(f"data_dir={c['data_dir']} was tokenized with {meta['vocab_size']} token "
                       f"ids but the model has vocab_size={model_config.vocab_size}")
    first = first_token_id(c['first_token'], meta['tokenizer'])
    return (meta, Windows(c['data_dir'], 'train', model_config.block_size, first),
            Windows(c['data_dir'], 'val', model_config.block_size, first))


def init_matched(model, seed):
    """Each module initialised again from (seed, its name) alone: variants of one seed start equal
    in every tensor they share (matched_init). The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            digest = hashlib.sha256(f'{seed}:{name}'.encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], 'little'))
            model._init_weights(module)


def build_model(c, model_config, run, data_meta, ckpt_path):
    """(the GPT, its AdamW, where the loop starts): fresh from the seed, or out_dir's checkpoint
    continued bit-exactly; compiled and sharded as the config asks."""
    torch.manual_seed(c['seed'])
    model = GPT(model_config)
    if c['matched_init']:
        init_matched(model, c['seed'])
    model = model.to(run.device)  # whole on every rank first: FSDP starts from DDP's weights
    for layer in model.model.layers:
        layer.activation_checkpointing = c['activation_checkpointing']
    ckpt, changes, predated = resume_point(c, model_config, data_meta, ckpt_path)
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])  # full tensors, before any sharding
    if run.master:  # the first line of every run says how it started
        replacing = f" (replacing {ckpt_path})" if os.path.isfile(ckpt_path) else ''
        how = f"resuming from {ckpt_path} at step {ckpt['step']}" if ckpt is not None else (
            f"starting fresh{replacing}")
        how += (f": nothing to do, max_iters={c['max_iters']} (a larger one continues the run)"
                * (ckpt is not None and ckpt['step'] >= c['max_iters']))
        print(f"init_from={c['init_from']}: {how}" + ''.join(
            f"; {key} {change['from']} -> {change['to']} (resume_lr_change=True)"
            for key, change in changes.items()), flush=True)
        if predated:
            print(f"note: {ckpt_path} predates the key{'s' * (len(predated) > 1)} "
                  f"{', '.join(predated)}; "
                  f"{'they take their defaults' if len(predated) > 1 else 'it takes its default'} "
                  f"{', '.join(f'{key}={value!r}' for key, value in predated.items())}",
                  file=sys.stderr, flush=True)
    if c['compile']:
        compile_layers(model)
    if c['fsdp']:
        apply_fsdp(model, c['dtype'])
    optimizer = configure_optimizers(model, c['weight_decay'], c['learning_rate'],
                                     (c['beta1'], c['beta2']), no_decay=c['no_decay'])
    if ckpt is None:
        return model, optimizer, dict(step=0, skipped=0, first_skipped=None, lr_changes={})
    # the full state, keyed by name; under FSDP each rank keeps its shard
    set_optimizer_state_dict(model, optimizer, ckpt['optimizer'],
                             options=StateDictOptions(full_state_dict=True))
    set_rng_state(ckpt['rng'])
    skipped = ckpt.get('skipped', {})  # a checkpoint from before it was saved counted none
    return model, optimizer, dict(step=ckpt['step'], skipped=skipped.get('steps', 0),
                                  first_skipped=skipped.get('first'), lr_changes=changes)


def load_run_teacher(c, model_config, data_meta, device):
    """The KD teacher (or None) in the run's dtype, checked against the data and the student."""
    if not c['teacher']:
        return None
    dtype = torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32
    teacher = load_teacher(c['teacher'], device, dtype)
    check_compatibility(teacher, c['teacher'], model_config, data_meta, model_config.block_size)
    if c['compile']:
        compile_layers(teacher)
    return teacher


def save(path, step, skipped, c, run, raw_model, optimizer, model_config, data_meta):
    """ckpt.pt at `step`: full tensors on rank 0's CPU (every rank gathers FSDP's shards); the
    others wait in the save group's barrier while rank 0 writes."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(raw_model, options=options)
    optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
    if run.master:
        save_run_checkpoint(path, c, step, skipped, model_state, optimizer_state, model_config,
                            data_meta)
    del model_state, optimizer_state
    if run.distributed:
        dist.barrier(group=run.save_group)


def take_step(c, run, model, raw_model, teacher, optimizer, train_data, step, teacher_timer):
    """The optimizer step after `step` steps: micro-steps' forward, loss and backward, clipping,
    AdamW's update if all is finite. Returns (lr, loss, KD, CE, grad norm, finite)."""
    B, lr = c['micro_batch_size'], learning_rate(step, c)
    for group in optimizer.param_groups:
        group['lr'] = lr
    # this rank's part of the step's global batch (a function of (seed, step) only)
    batch = train_data.step_indices(c['seed'], step, c['global_batch_size'])
    mine = batch[run.rank * run.accumulation * B:]
    losses = torch.zeros(3, device=run.device)  # (loss, KD, CE) summed on the device
    for micro in range(run.accumulation):
        x, y = batch_to_device(train_data.get(mine[micro * B:(micro + 1) * B]), run.device)
        # DDP all-reduces in the last micro-step's backward only; FSDP reduce-scatters in each
        with model.no_sync() if run.ddp and micro < run.accumulation - 1 else nullcontext():
            with run.autocast:
                loss, kd, ce = compute_loss(model, raw_model, teacher, x, y,
                                            fused=c['kd_loss'] == 'fused',
                                            temperature=c['kd_temperature'],
                                            kd_alpha=c['kd_alpha'], teacher_timer=teacher_timer)
            (loss / run.accumulation).backward()
        losses += torch.stack([loss.detach(), kd, ce])
    # the raw norm before clipping (paper Tables 4-5); grad_clip=0 only measures it
    grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c['grad_clip'] or math.inf)
    grad_norm = full_tensor(grad_norm).item()
    loss, kd, ce = reduce_mean(losses / run.accumulation, run.device)
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    elif c['nonfinite'] == 'stop':
        raise RunError(f"step {step + 1}: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
                       "stopping. To continue from the last checkpoint with a lower learning rate: "
                       "--learning_rate=<lower> --resume_lr_change=True (nonfinite='skip' skips "
                       "such steps instead)")
    return lr, loss, kd, ce, grad_norm, finite


def train(c, model_config, run, data_meta, train_data, val_data, wandb):
    """The run, in out_dir (which rank 0 holds): the model built or resumed, then the loop."""
    ckpt_path = checkpoint_path(c['out_dir'])
    raw_model, optimizer, start = build_model(c, model_config, run, data_meta, ckpt_path)
    step, skipped, first_skipped = start['step'], start['skipped'], start['first_skipped']
    saved = step or None  # the step of this run's last checkpoint
    if step >= c['max_iters']:  # nothing to do (build_model said so): its files left as they are
        return None
    model = wrap_ddp(raw_model, run.device) if run.ddp else raw_model
    teacher = load_run_teacher(c, model_config, data_meta, run.device)
    peak_flops = c['peak_flops'] or default_peak_flops(
        run.device, torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32,
        gemm_shapes(raw_model, c['micro_batch_size'] * model_config.block_size))
    metrics = Metrics(c, run, step, wandb)
    for note in start_notes(c, val_data) if run.master else ():
        print(note, file=sys.stderr, flush=True)
    if start['lr_changes']:  # from the first step it applies to
        metrics.write(dict(step=step + 1, event='resume_lr_change', **start['lr_changes']))
    if run.master:
        print(f"GPT: {raw_model.get_num_params():,} parameters, "
              f"attention={model_config.attention}; {run.world} rank(s) x {run.accumulation} "
              f"micro-steps x {c['micro_batch_size']} sequences x {model_config.block_size} "
              f"tokens; {'FSDP' if c['fsdp'] else 'DDP' if run.distributed else 'one process'}, "
              f"{run.device}, {c['dtype']}"
              f"{', activation checkpointing' if c['activation_checkpointing'] else ''}; "
              f"{len(train_data):,} train windows; MFU of a {peak_flops / 1e12:.4g} TFLOP/s peak")
    teacher_timer = DeviceTimer(run.device)  # the teacher's forward time
    model.train()
    with preemption_flag() as signals:
        while step < c['max_iters']:
            t0 = time.perf_counter()
            lr, loss, kd, ce, grad_norm, finite = take_step(
                c, run, model, raw_model, teacher, optimizer, train_data, step, teacher_timer)
            alpha_means = raw_model.update_alpha_ma(discard=not finite)  # Eq. 9, this batch's
            optimizer.zero_grad(set_to_none=not run.ddp)  # DDP: in place, they are its buckets
            step, skipped, dt = step + 1, skipped + (not finite), time.perf_counter() - t0
            if not finite and first_skipped is None:
                first_skipped = step

            record = dict(step=step, lr=lr, loss=loss, grad_norm=grad_norm,
                          tokens_per_sec=c['global_batch_size'] * model_config.block_size / dt,
                          mfu=estimate_mfu(raw_model, c['global_batch_size'] / run.world, dt,
                                           peak_flops), dt=dt)
            if run.device.type == 'cuda':  # this rank's peak so far, against the memory plan
                record['peak_memory_gib'] = torch.cuda.max_memory_allocated(run.device) / 2 ** 30
            if teacher is not None:
                record.update(kd_loss=kd, ce_loss=ce, teacher_sec=teacher_timer.seconds())
            if c['nonfinite'] == 'skip':
                record['skipped_steps'] = skipped
            evaluated = step % c['eval_interval'] == 0 or step == c['max_iters']
            if evaluated:  # (nothing, where a signal cut it short: then saved below, unevaluated)
                record |= evaluation_record(c, run, model, raw_model, val_data, alpha_means,
                                            signals)
            metrics.write(record)
            if skipped > c['max_skipped_frac'] * c['max_iters']:
                raise RunError(f"step {step}: the run has skipped {skipped} step(s) (non-finite "
                               f"loss or gradient norm), the first at step {first_skipped}: more "
                               f"than max_skipped_frac={c['max_skipped_frac']} of "
                               f"max_iters={c['max_iters']}; stopping without saving (out_dir's "
                               "checkpoint, if any, is from before). To continue from it with a "
                               "lower learning rate: --learning_rate=<lower> "
                               "--resume_lr_change=True (or allow more: --max_skipped_frac)")
            stop = reduce_mean([float(bool(signals or metrics.stop))], run.device)[0] > 0
            if evaluated or stop:
                check_step_finite(step, record, raw_model, run.device, ckpt_path, saved)
                save(ckpt_path, step, dict(steps=skipped, first=first_skipped), c, run, raw_model,
                     optimizer, model_config, data_meta)
                saved = step
            if stop:  # (main raises it: exit status 128 + the signal's number)
                cut = " (its evaluation, cut short, is not logged)" * (
                    evaluated and 'val_loss' not in record)
                return stopped_after_save(signals + metrics.stop, run.master, f"saved {ckpt_path} "
                                          f"at step {step}{cut}; the same command continues it")
    if skipped and run.master:
        print(f"nonfinite=skip: {skipped} of the run's {step} steps were skipped (non-finite loss "
              f"or gradient norm), the first at step {first_skipped}", flush=True)


def main(argv):
    c = load_config(argv, description='\n\n'.join(__doc__.split('\n\n')[:2]))
    try:
        model_config = ModelConfig(**{k: c[k] for k in FIELD_NAMES})
    except ValueError as e:  # ModelConfig's own checks (variant names, head counts, rope_scaling)
        raise RunError(f"config: {e}")
    if c['dry_run']:
        return dry_run(c, model_config)
    run = setup_run(c)
    wandb = import_wandb() if c['wandb_log'] and run.master else None
    data_meta, train_data, val_data = load_data(c, model_config)
    check_sizes(c, train_data, val_data)
    claim_out_dir(c['out_dir'])
    # one writer per run: rank 0 holds out_dir (and creates it) until the run ends
    with hold_out_dir(c['out_dir']) if run.master else nullcontext():
        stop = train(c, model_config, run, data_meta, train_data, val_data, wandb)
    if run.distributed:
        dist.destroy_process_group()
    if stop:  # every rank stopped at one step, as at a run's end
        raise stop


if __name__ == '__main__':
    run_script(main)
