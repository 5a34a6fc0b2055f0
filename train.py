"""
Train a student with the paper's recipe (Section 5.1, Appendix B.1), on one CPU or many GPUs.

    python train.py config/tiny_cpu.py --data_dir=data/builtin_bytes --max_iters=200  # a CPU
    torchrun --standalone --nproc_per_node=8 train.py config/affine_1b.py  # 8 GPUs, DDP
    python train.py config/affine_3b.py --dry_run=True  # parameter counts, memory plan per GPU

Reading order: train, at the bottom, is the loop as nanoGPT writes it (forward, loss, backward,
clip, step, log, eval, save). The functions above it set it up, and main checks everything before
anything is written. The keys, the checks and their messages, and the records: lmkit/runs.py.
"""
import dataclasses
import hashlib
import math
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch
import torch.distributed as dist

from distill import check_compatibility, compute_loss, load_teacher
from lmkit.data import Windows, first_token_id, read_meta
from lmkit.distributed import (apply_fsdp, batch_to_device, check_cpu_compiler, compile_layers,
                               full_tensor, init_distributed, preemption_flag, reduce_mean,
                               resolve_device, resolve_dtype, wrap_ddp)
from lmkit.errors import RunError, run_script, stopped_after_save
from lmkit.runs import (Metrics, SkippedSteps, check_launch, check_sizes, check_step_finite,
                        checkpoint_path, claim_out_dir, configure_optimizers,
                        hold_out_dir, import_wandb, load_config, print_how_it_starts,
                        resume_point, run_config, save_run_checkpoint, set_rng_state, start_line,
                        start_notes, validation_batches)
from model import FIELD_NAMES, GPT, ModelConfig

SAVE_TIMEOUT = timedelta(hours=2)  # how long ranks wait for rank 0's save (NCCL's default: 10 min)

# The schedule, and what an evaluation measures ------------------------------------------------

def learning_rate(step, c):
    """Warmup-stable-decay: a linear warmup, a constant rate, then a linear decay to min_lr."""
    if step < c['warmup_iters']:
        return c['learning_rate'] * (step + 1) / c['warmup_iters']
    decay_start = int(c['max_iters'] * (1 - c['decay_frac']))
    if step < decay_start:
        return c['learning_rate']
    progress = (step - decay_start) / max(1, c['max_iters'] - decay_start)
    return c['learning_rate'] + (c['min_lr'] - c['learning_rate']) * progress


EVAL_STOP_EVERY = 4  # validation batches between looks at the stop signal (a collective sync)


@torch.no_grad()
def validation_loss(model, val_data, c, device, autocast, stop=()):
    """The mean validation loss per token over validation_batches batches, split over the ranks.
    Every rank runs as many forwards, as FSDP's all-gathers need. None if `stop` fills meanwhile."""
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
    """Measure the validation loss, the mean attention logit (Figure 2), the variant's tensors and,
    with attention_windows, the sink. Every rank takes part. Empty if a signal cut it short."""
    val_loss = validation_loss(model, val_data, c, run.device, run.autocast, stop)
    if val_loss is None:
        return {}
    from lmkit.probes import evaluation_measures  # the paper's measures, in one call
    windows = val_data.get(range(max(1, c['attention_windows'])))  # the same ones every time
    with run.autocast:
        return dict(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50))) | evaluation_measures(
            raw_model, batch_to_device(windows, run.device)[0], c['attention_windows'] > 0,
            alpha_means)


# Setup: the ranks, the data, the model, the teacher, the records ------------------------------

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
    """Find this process's rank and device (torchrun's environment), and resolve the 'auto's."""
    distributed, env = 'RANK' in os.environ, os.environ
    rank, world = (int(env['RANK']), int(env['WORLD_SIZE'])) if distributed else (0, 1)
    accumulation = check_launch(c, distributed, world)
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
    bf16 = c['dtype'] == 'bfloat16'
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    return Run(rank, world, device, distributed, distributed and not c['fsdp'], accumulation,
               autocast, save_group)


def load_data(c, model_config):
    """Read data_dir's meta.json and its train and val windows, checked against the model."""
    meta = read_meta(c['data_dir'])
    if meta['vocab_size'] > model_config.vocab_size:
        raise RunError(f"data_dir={c['data_dir']} was tokenized with {meta['vocab_size']} token "
                       f"ids but the model has vocab_size={model_config.vocab_size}")
    first = first_token_id(c['first_token'], meta['tokenizer'])
    return (meta, Windows(c['data_dir'], 'train', model_config.block_size, first),
            Windows(c['data_dir'], 'val', model_config.block_size, first))


def init_matched(model, seed):
    """Initialise each module again from (seed, its name) alone, so that variants of one seed start
    equal in every tensor they share (matched_init). The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            digest = hashlib.sha256(f'{seed}:{name}'.encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], 'little'))
            model._init_weights(module)


def build_model(c, model_config, run, data_meta, ckpt_path):
    """Build the GPT and its AdamW, fresh from the seed or continuing out_dir's checkpoint bit for
    bit, compiled and sharded as the config asks. Returns them and where the loop starts."""
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
    if run.master:
        print_how_it_starts(c, ckpt, ckpt_path, changes, predated)
    if c['compile']:
        compile_layers(model)
    if c['fsdp']:
        apply_fsdp(model, c['dtype'])
    optimizer = configure_optimizers(model, c['weight_decay'], c['learning_rate'],
                                     (c['beta1'], c['beta2']), no_decay=c['no_decay'])
    if ckpt is None:
        return model, optimizer, dict(step=0, skipped={}, lr_changes={})
    # the full state, keyed by name; under FSDP each rank keeps its shard
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, ckpt['optimizer'],
                             options=StateDictOptions(full_state_dict=True))
    set_rng_state(ckpt['rng'])  # (a checkpoint older than 'skipped' skipped no step)
    return model, optimizer, dict(step=ckpt['step'], skipped=ckpt.get('skipped', {}),
                                  lr_changes=changes)


def load_run_teacher(c, model_config, data_meta, device):
    """Load the KD teacher (or None) in the run's dtype, checked against the data and student."""
    if not c['teacher']:
        return None
    teacher = load_teacher(c['teacher'], device, getattr(torch, c['dtype']))
    check_compatibility(teacher, c['teacher'], model_config, data_meta, model_config.block_size)
    if c['compile']:
        compile_layers(teacher)
    return teacher


def save(path, step, skipped, c, run, raw_model, optimizer, model_config, data_meta):
    """Save ckpt.pt at `step`. Every rank gathers FSDP's shards into full tensors on rank 0's CPU,
    then the others wait in the save group's barrier while rank 0 writes."""
    from torch.distributed.checkpoint.state_dict import (  # slow, so imported here
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(raw_model, options=options)
    optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
    if run.master:
        save_run_checkpoint(path, c, step, skipped, model_state, optimizer_state, model_config,
                            data_meta)
    del model_state, optimizer_state
    if run.distributed:
        dist.barrier(group=run.save_group)


def start_records(c, run, raw_model, start, train_data, val_data, wandb):
    """Print the notes and the line a run starts with. Returns its step meter (tokens/s and MFU),
    the timer of the teacher's forwards and its metrics."""
    from lmkit.measure import DeviceTimer, StepMeter  # the instruments (docs/training.md, MFU)
    meter = StepMeter(raw_model, run.device, getattr(torch, c['dtype']), c['global_batch_size'],
                      run.world, c['micro_batch_size'], c['peak_flops'])
    metrics = Metrics(c, run, start['step'], wandb)
    for note in start_notes(c, val_data) if run.master else ():
        print(note, file=sys.stderr, flush=True)
    if start['lr_changes']:  # from the first step it applies to
        metrics.write(dict(step=start['step'] + 1, event='resume_lr_change', **start['lr_changes']))
    if run.master:
        print(start_line(c, run, raw_model.get_num_params(), len(train_data), meter.peak_flops))
    return meter, DeviceTimer(run.device), metrics


# One optimizer step, and the loop -------------------------------------------------------------

def take_step(c, run, model, raw_model, teacher, optimizer, train_data, step, teacher_timer):
    """Take the optimizer step after `step` steps: each micro-step's forward, loss and backward,
    then clipping, then AdamW's update if the loss and the gradient norm are finite. Returns the
    learning rate, the loss, KD, CE, the gradient norm and whether the step was finite."""
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
    return lr, loss, kd, ce, grad_norm, finite


def train(c, model_config, run, data_meta, train_data, val_data, wandb):
    """The run in out_dir, which rank 0 holds: the model built or resumed, then the loop."""
    ckpt_path = checkpoint_path(c['out_dir'])
    raw_model, optimizer, start = build_model(c, model_config, run, data_meta, ckpt_path)
    step, saved = start['step'], start['step'] or None  # saved: the step of the last checkpoint
    if step >= c['max_iters']:  # nothing to do (build_model said so): its files left as they are
        return None
    model = wrap_ddp(raw_model, run.device) if run.ddp else raw_model
    teacher = load_run_teacher(c, model_config, data_meta, run.device)
    meter, teacher_timer, metrics = start_records(c, run, raw_model, start, train_data, val_data,
                                                  wandb)
    skipped = SkippedSteps(c, start['skipped'])
    model.train()
    with preemption_flag() as signals:
        while step < c['max_iters']:
            t0 = time.perf_counter()
            lr, loss, kd, ce, grad_norm, finite = take_step(
                c, run, model, raw_model, teacher, optimizer, train_data, step, teacher_timer)
            alpha_means = raw_model.update_alpha_ma(discard=not finite)  # Eq. 9, this batch's
            optimizer.zero_grad(set_to_none=not run.ddp)  # DDP: in place, they are its buckets
            step, dt = step + 1, time.perf_counter() - t0
            skipped.count(step, finite, loss, grad_norm)
            record = dict(step=step, lr=lr, loss=loss, grad_norm=grad_norm) | meter.record(dt)
            if teacher is not None:
                record.update(kd_loss=kd, ce_loss=ce, teacher_sec=teacher_timer.seconds())
            if c['nonfinite'] == 'skip':
                record['skipped_steps'] = skipped.steps
            evaluated = step % c['eval_interval'] == 0 or step == c['max_iters']
            if evaluated:  # (nothing, where a signal cut it short: then saved below, unevaluated)
                record |= evaluation_record(c, run, model, raw_model, val_data, alpha_means,
                                            signals)
            metrics.write(record)
            skipped.check(step)
            stop = reduce_mean([float(bool(signals or metrics.stop))], run.device)[0] > 0
            if evaluated or stop:
                check_step_finite(step, record, raw_model, run.device, ckpt_path, saved)
                save(ckpt_path, step, skipped.saved(), c, run, raw_model, optimizer, model_config,
                     data_meta)
                saved = step
            if stop:  # (main raises it: exit status 128 + the signal's number)
                cut = " (its evaluation, cut short, is not logged)" * (
                    evaluated and 'val_loss' not in record)
                return stopped_after_save(signals + metrics.stop, run.master, f"saved {ckpt_path} "
                                          f"at step {step}{cut}; the same command continues it")
    if skipped.steps and run.master:
        print(skipped.summary(step), flush=True)


def main(argv):
    c = load_config(argv, description='\n\n'.join(__doc__.split('\n\n')[:2]))
    try:
        model_config = ModelConfig(**{k: c[k] for k in FIELD_NAMES})
    except ValueError as e:  # ModelConfig's own checks (variant names, head counts, rope_scaling)
        raise RunError(f"config: {e}")
    if c['dry_run']:  # the parameter counts and the memory plan, then nothing else
        from lmkit.memory_plan import print_dry_run  # (the one call train.py makes into it)
        return print_dry_run(run_config(c), model_config)
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
