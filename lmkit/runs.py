"""What other programs need to know about a train.py run: its keys (KEYS, RunConfig), its optimizer,
out_dir and checkpoint, the one rule for continuing it (RESUME_MAY_CHANGE), and the checks, notes
and records (Metrics) of a run as it goes, with their messages. lmkit/run_records.py reads a run's
records back. Only train.py and this module read a run's config by key.
"""
import dataclasses
import json
import math
import os
import random
import statistics
import sys

import numpy as np
import torch

from configurator import DEVICE, Key, parse
from lmkit.checkpoint import (CKPT_KEYS, CKPT_NAME, CheckpointError, is_run_config, model_state,
                              previous_checkpoint, read_checkpoint, save_checkpoint)
from lmkit.distributed import nonfinite_model_tensors
from lmkit.errors import RunError, print_or_stop
from lmkit.files import atomic_write, claim_dir, lock_dir, read_log, set_aside, write_json
from lmkit.progress import duration
from model import AFFINE_ACTS, AFFINE_BIAS_NORMS, ATTENTIONS, GATES, MODEL_SHAPES, ModelConfig

# The keys, the paper's recipe as defaults, and ModelConfig's fields. A key added later defaults to
# what the code did before it: a checkpoint from before it resumes with it (recorded_config).
TRAIN_KEYS = dict(
    out_dir=Key('out', "where ckpt.pt, metrics.jsonl and config.json go"),
    data_dir=Key('data/fineweb_edu_llama3', "a prepare_data.py output directory"),
    first_token=Key('stream', "what starts a window (docs/data.md)", choices=('stream', 'prefix')),
    init_from=Key('auto', "continue out_dir's checkpoint: if any, always, never",
                  choices=('auto', 'resume', 'scratch')),
    overwrite=Key(False, "with init_from=scratch: replace out_dir's checkpoint"),
    keep_previous=Key(True, "keep the checkpoint a save replaces as ckpt.prev.pt (a hard link)"),
    max_iters=Key(9000, "optimizer steps (Appendix B.1)", min=1),
    global_batch_size=Key(1024, "sequences per optimizer step, all ranks (Section 5.1)", min=1),
    micro_batch_size=Key(8, "sequences per forward on one rank", min=1),
    learning_rate=Key(1e-3, "AdamW's peak rate (Section 5.1)", above=0, max=1),
    min_lr=Key(0.0, "learning rate at the end of the decay", min=0),
    resume_lr_change=Key(False, "on resume: let learning_rate and min_lr change (logged)"),
    warmup_iters=Key(100, "linear warmup steps (Appendix B.1)", min=0),
    decay_frac=Key(0.2, "share of the steps that decays linearly to min_lr", min=0, max=1),
    weight_decay=Key(0.1, "AdamW, on matrices only (Section 5.1)", min=0),
    matched_init=Key(False, "initialise each module from (seed, its name) alone"),
    no_decay=Key([], "modules whose matrices do not decay (the sink study's control)",
                 choices=('alpha_proj', 'g_proj', 'q_proj', 'k_proj', 'v_proj', 'o_proj',
                          'gate_proj', 'up_proj', 'down_proj', 'embed_tokens', 'lm_head')),
    beta1=Key(0.9, "AdamW", min=0, below=1),
    beta2=Key(0.95, "AdamW", min=0, below=1),
    grad_clip=Key(1.0, "clip the global gradient norm (0: off)", min=0),
    seed=Key(1337, "the initial weights and the order of the data", min=0, max=2 ** 64 - 1),
    eval_interval=Key(500, "evaluate, measure attention and save every this many steps", min=1),
    eval_batches=Key(20, "validation batches of micro_batch_size sequences", min=1),
    attention_windows=Key(0, "validation windows an evaluation measures the sink on", min=0),
    log_interval=Key(10, "console line every this many steps", min=1),
    nonfinite=Key('stop', "on a non-finite loss or gradient norm", choices=('stop', 'skip')),
    max_skipped_frac=Key(0.05, "nonfinite=skip: stop past this share of steps", min=0, max=1),
    device=DEVICE,
    dtype=Key('auto', "auto: bfloat16 where a GPU has it", choices=('auto', 'float32', 'bfloat16')),
    compile=Key(None, "torch.compile per decoder layer; None: on for CUDA", types=(bool,)),
    peak_flops=Key(None, "a device's peak FLOP/s, for MFU", types=(float, int), above=0),
    teacher=Key(None, "distil from: a Hugging Face directory or a checkpoint", types=(str,)),
    kd_temperature=Key(1.0, "T of the KD loss", above=0, max=100),
    kd_alpha=Key(1.0, "loss = kd_alpha * KD + (1 - kd_alpha) * CE", min=0, max=1),
    kd_loss=Key('fused', "distill.fused_kd_loss, or distill.kd_loss", choices=('fused', 'plain')),
    wandb_log=Key(False, "also log to Weights & Biases"),
    wandb_project=Key('affine-scaled-attention'), wandb_run_name=Key(None, types=(str,)),
    fsdp=Key(False, "shard the student over the ranks with FSDP2 (needs torchrun)"),
    activation_checkpointing=Key(False, "recompute each decoder layer in backward"),
    dry_run=Key(False, "print parameter counts and the memory plan, exit"),
    dry_run_world_size=Key(8, "GPUs the dry run's memory plan assumes", min=1),
    dry_run_gpu_gib=Key(80.0, "memory of one GPU, for the dry run's verdict", above=0),
)

# what must hold between the keys (an empty out_dir would write into the working folder)
RULES = ('min_lr <= learning_rate', "out_dir != ''")

# what each ModelConfig field's key declares besides its default (docs/training.md, Configuration)
MODEL_FIELD_KEYS = dict(
    n_layer=dict(min=1), n_head=dict(min=1), n_kv_head=dict(min=1), n_embd=dict(min=1),
    intermediate_size=dict(min=1), vocab_size=dict(min=1), block_size=dict(min=1),
    rope_theta=dict(above=1, max=1e9, help="RoPE's base"), rope_scaling=dict(types=(dict,)),
    rms_norm_eps=dict(above=0, max=1e-3), init_std=dict(above=0),
    attention=dict(choices=ATTENTIONS), affine_act=dict(choices=AFFINE_ACTS),
    gate=dict(choices=GATES + (True, False), types=(str, bool)),  # a bool before the head-wise
    affine_momentum=dict(min=0, max=1),
    affine_bias_norm=dict(choices=AFFINE_BIAS_NORMS))

KEYS = {**TRAIN_KEYS,
        **{f.name: Key(f.default, **{'help': "ModelConfig (model.py)",
                                     **MODEL_FIELD_KEYS.get(f.name, {})})
           for f in dataclasses.fields(ModelConfig)},
        # a published shape by name: sets its ModelConfig fields where it stands
        'model': Key(None, "a published shape (model.MODEL_SHAPES)", choices=tuple(MODEL_SHAPES),
                     types=(str,), expands=MODEL_SHAPES)}
KEY_DEFAULTS = {name: key.default for name, key in KEYS.items()}


def load_config(argv, description=''):
    """Defaults <- config files <- --key=value overrides, each checked, as recorded_config reads."""
    c = parse(argv, KEYS, description, files=True, prog='train.py', rules=RULES)
    return recorded_config(c)[0]


# A run's config as a typed object, for every other module (a misspelt key: AttributeError)
RunConfig = dataclasses.make_dataclass('RunConfig', list(KEYS), frozen=True)


def run_config(config):
    """The RunConfig of a config dict: load_config's, a checkpoint's or a config.json's."""
    config = recorded_config(config)[0]
    return RunConfig(**{key: config[key] for key in KEYS})


def recorded_config(config):
    """Return a recorded config as this code reads it, and the keys it predates. Every key added
    since it was written takes its default, and an older run's gate (a bool) becomes its kind."""
    missing = [key for key in KEY_DEFAULTS if key not in config]
    config = {**config, **{key: KEY_DEFAULTS[key] for key in missing}}
    return {**config, 'gate': ModelConfig(gate=config['gate']).gate}, missing


def configure_optimizers(model, weight_decay, lr, betas, fused=None, no_decay=()):
    """AdamW; matrices (embeddings and projections) decay, vectors (norms, biases, sinks) do not,
    nor do the matrices of the modules named in no_decay."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decays = [p.dim() >= 2 and not set(no_decay) & set(n.split('.')) for n, p in named]
    groups = [{'params': [p for (_, p), d in zip(named, decays) if d],
               'weight_decay': weight_decay},
              {'params': [p for (_, p), d in zip(named, decays) if not d], 'weight_decay': 0.0}]
    if fused is None:
        fused = all(p.device.type == 'cuda' for _, p in named)
    # elsewhere multi-tensor (torch's default only on CUDA): the same numbers, a tenth of the ops
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused, foreach=not fused)


# A run's out_dir and checkpoint ---------------------------------------------------------------

def start_log(c, start_step):
    """out_dir's config.json, and its metrics.jsonl as a run starts it: a resume keeps the records
    up to its step; a fresh start sets an earlier log aside (files.set_aside)."""
    path = os.path.join(c['out_dir'], 'metrics.jsonl')
    kept = []
    if start_step and os.path.isfile(path):
        kept = [record for record in read_log(path) if record['step'] <= start_step]
    elif os.path.isfile(path) and os.path.getsize(path):
        print(f"note: {path} holds the log of an earlier run in {c['out_dir']}, which this one "
              f"does not continue: kept as {set_aside(path)}; a new log begins",
              file=sys.stderr, flush=True)
    write_json(os.path.join(c['out_dir'], 'config.json'), c)
    with atomic_write(path) as f:
        f.writelines(json.dumps(record) + '\n' for record in kept)
    return path


def checkpoint_path(out_dir):
    return os.path.join(out_dir, CKPT_NAME)


def claim_out_dir(out_dir):
    """RunError, before any work, where out_dir holds files that are not a run's own: another
    tool's output, or files of the names a run writes (files.claim_dir)."""
    claim_dir(out_dir, 'train.py', ours=lambda names: CKPT_NAME in names or is_run_config(out_dir),
              writes=(CKPT_NAME, 'config.json', 'metrics.jsonl'))


def hold_out_dir(out_dir):
    """One writer per run: the holder (rank 0) creates out_dir and holds it until the run ends."""
    return lock_dir(out_dir, 'train.py')


def data_fingerprint(meta):
    """What identifies a prepare_data.py directory's contents: the tokenizer, each split's size."""
    splits = sorted(meta['splits'].items())
    return dict(tokenizer=meta['tokenizer']['sha256'],
                **{f'{name}_tokens': split['tokens'] for name, split in splits})


def rng_state():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state):
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if state['cuda'] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


# Continuing a run: the one rule ---------------------------------------------------------------

# What may differ between a checkpoint's run and the run that continues it: nothing that changes
# what a step computes (docs/training.md, Never lose a run)
RESUME_MAY_CHANGE = {'out_dir', 'data_dir', 'init_from', 'overwrite', 'keep_previous', 'max_iters',
                     'micro_batch_size', 'eval_interval', 'eval_batches', 'log_interval',
                     'nonfinite', 'max_skipped_frac', 'device', 'compile', 'peak_flops',
                     'wandb_log', 'wandb_project', 'wandb_run_name', 'kd_loss', 'fsdp',
                     'activation_checkpointing', 'dry_run', 'dry_run_world_size', 'dry_run_gpu_gib',
                     'resume_lr_change', 'attention_windows'}
# What a resume changes only when asked to (resume_lr_change=True; recorded in metrics.jsonl)
LR_KEYS = ('learning_rate', 'min_lr')
LOWER_LR = "with a lower learning rate: --learning_rate=<lower> --resume_lr_change=True"


def changed_settings(old, new, also=()):
    """[(key, old, new)] of the settings whose change makes a continued run another run: every key
    outside RESUME_MAY_CHANGE, and those of `also`."""
    return [(key, old[key], new[key]) for key in sorted(new)
            if (key in also or key not in RESUME_MAY_CHANGE) and old[key] != new[key]]


def check_resumable(ckpt, c, model_config, data_meta, path):
    """RunError listing what makes continuing `ckpt` with config `c` another run (the model, a key
    outside RESUME_MAY_CHANGE, the data); else the keys the checkpoint predates, with defaults."""
    old, missing = recorded_config({**ckpt['config'], **ckpt['model_config']})
    changed = [f"{key}: {before!r} -> {after!r}" for key, before, after in
               changed_settings(old, {**c, **dataclasses.asdict(model_config)})]
    if ckpt['data'] != data_fingerprint(data_meta):
        changed.append(f"the data: {ckpt['data']} -> {data_fingerprint(data_meta)} "
                       f"(data_dir={c['data_dir']})")
    if changed:
        may = f"{', '.join(sorted(RESUME_MAY_CHANGE))}; {' and '.join(LR_KEYS)} with "
        raise RunError(f"{path} was written by a different run; continuing it with these settings "
                       "would not be the same run:\n  - " + "\n  - ".join(changed)
                       + f"\nKeys that may change on resume: {may}--resume_lr_change=True "
                       "(recorded in metrics.jsonl). To start a new run instead: another "
                       "--out_dir, or --init_from=scratch --overwrite=True.")
    return {key: old[key] for key in missing}


def lr_changes(ckpt, c):
    """{key: {'from': the checkpoint's, 'to': this run's}} of the LR_KEYS this resume changes,
    where resume_lr_change=True allows it (else {})."""
    return {key: {'from': ckpt['config'][key], 'to': c[key]} for key in LR_KEYS
            if c['resume_lr_change'] and ckpt['config'][key] != c[key]}


def checkpoint_to_resume(c, ckpt_path):
    """out_dir's checkpoint if this run continues it, else None; refuses to replace one unasked."""
    exists, previous = os.path.isfile(ckpt_path), previous_checkpoint(ckpt_path)
    if not exists and os.path.isfile(previous) and not c['overwrite']:
        raise RunError(f"{previous} is there without {ckpt_path}: to continue from it, mv "
                       f"{previous} {ckpt_path}; to start over (replacing it): --init_from=scratch "
                       "--overwrite=True")
    if c['init_from'] == 'resume' and not exists:
        raise RunError(f"init_from=resume: no checkpoint at {ckpt_path}")
    if not exists:
        return None
    try:
        ckpt = read_checkpoint(ckpt_path, keys=CKPT_KEYS)
    except CheckpointError as e:
        raise RunError(f"init_from={c['init_from']}: {e} (--init_from=scratch --overwrite=True "
                       "starts the run over)")
    if c['init_from'] == 'scratch' and not c['overwrite']:
        raise RunError(f"{ckpt_path} holds a run at step {ckpt['step']}, which init_from=scratch "
                       "would replace at its first save. To continue it: --init_from=auto (the "
                       "default). To start over and replace it: --init_from=scratch "
                       "--overwrite=True. Or choose another --out_dir.")
    return None if c['init_from'] == 'scratch' else ckpt


def resume_point(c, model_config, data_meta, path):
    """Find the checkpoint run c continues (or None), checked to be the same run but for the
    learning rates resume_lr_change allows. Returns it, those changes and the keys it predates."""
    ckpt = checkpoint_to_resume(c, path)
    if ckpt is None:
        return None, {}, {}
    changes = lr_changes(ckpt, c)  # asked for: not a difference to refuse
    asked = {key: change['from'] for key, change in changes.items()}
    predated = check_resumable(ckpt, {**c, **asked}, model_config, data_meta, path)
    return {**ckpt, 'model': model_state(ckpt)}, changes, predated


def save_run_checkpoint(path, c, step, skipped, model_state_dict, optimizer_state, model_config,
                        data_meta):
    """A run's ckpt.pt, which resume_point reads. skipped: {'steps': how many, 'first': step}."""
    save_checkpoint(path, dict(model=model_state_dict, optimizer=optimizer_state, step=step,
                               rng=rng_state(), config=c, skipped=skipped,
                               model_config=dataclasses.asdict(model_config),
                               tokenizer=data_meta['tokenizer'], data=data_fingerprint(data_meta)),
                    keep_previous=c['keep_previous'])


# A run as it goes: its checks, its first lines and its records --------------------------------

def check_launch(c, distributed, world):
    """The micro-steps per optimizer step on each of `world` ranks. RunError where fsdp=True has no
    ranks to shard over, or where the global batch does not split into whole micro-batches."""
    if c['fsdp'] and not distributed:
        raise RunError("fsdp=True shards the model over the ranks torchrun starts: launch with "
                       "torchrun --nproc_per_node=N train.py ... (N=1 works), or drop --fsdp=True "
                       "for one process")
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])
    if rest or accumulation == 0:
        raise RunError(f"global_batch_size={c['global_batch_size']} must be a multiple of world "
                       f"size ({world}) x micro_batch_size ({c['micro_batch_size']})")
    return accumulation


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


def start_line(c, run, parameters, train_windows, peak_flops):
    """The line that says how a run trains: the model, the batch over the ranks, the device."""
    how = 'FSDP' if c['fsdp'] else 'DDP' if run.distributed else 'one process'
    recompute = ', activation checkpointing' if c['activation_checkpointing'] else ''
    return (f"GPT: {parameters:,} parameters, attention={c['attention']}; {run.world} rank(s) x "
            f"{run.accumulation} micro-steps x {c['micro_batch_size']} sequences x "
            f"{c['block_size']} tokens; {how}, {run.device}, {c['dtype']}{recompute}; "
            f"{train_windows:,} train windows; MFU of a {peak_flops / 1e12:.4g} TFLOP/s peak")


def print_how_it_starts(c, ckpt, path, changes, predated):
    """Print the first line of every run: a fresh start, or the checkpoint it resumes and the
    learning rates the resume changes. Then, on stderr, the keys the checkpoint predates and the
    defaults they take."""
    if ckpt is None:
        how = f"starting fresh (replacing {path})" if os.path.isfile(path) else "starting fresh"
    elif ckpt['step'] < c['max_iters']:
        how = f"resuming from {path} at step {ckpt['step']}"
    else:
        how = (f"resuming from {path} at step {ckpt['step']}: nothing to do, "
               f"max_iters={c['max_iters']} (a larger one continues the run)")
    print(f"init_from={c['init_from']}: {how}" + ''.join(
        f"; {key} {change['from']} -> {change['to']} (resume_lr_change=True)"
        for key, change in changes.items()), flush=True)
    if predated:
        print(f"note: {path} predates these keys, which take their defaults: "
              f"{', '.join(f'{key}={value!r}' for key, value in predated.items())}",
              file=sys.stderr, flush=True)


class SkippedSteps:
    """The steps a run skipped for a non-finite loss or gradient norm (nonfinite='skip'): how many,
    and the first. With nonfinite='stop' the first such step stops the run instead. A checkpoint
    keeps both (its 'skipped', from `saved`), so a resumed run counts on."""

    def __init__(self, c, saved):
        self.c, self.steps, self.first = c, saved.get('steps', 0), saved.get('first')

    def count(self, step, finite, loss, grad_norm):
        """Count `step`, the step just taken, if its loss or gradient norm was not finite."""
        if finite:
            return
        if self.c['nonfinite'] == 'stop':
            raise RunError(f"step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
                           f"stopping. To continue from the last checkpoint {LOWER_LR} "
                           "(nonfinite='skip' skips such steps instead)")
        self.steps += 1
        self.first = self.first or step

    def check(self, step):
        """RunError once the run has skipped more than max_skipped_frac of max_iters."""
        if self.steps > self.c['max_skipped_frac'] * self.c['max_iters']:
            raise RunError(f"step {step}: the run has skipped {self.steps} step(s) (non-finite "
                           f"loss or gradient norm), the first at step {self.first}: more than "
                           f"max_skipped_frac={self.c['max_skipped_frac']} of "
                           f"max_iters={self.c['max_iters']}; stopping without saving (out_dir's "
                           f"checkpoint, if any, is from before). To continue from it {LOWER_LR} "
                           "(or allow more: --max_skipped_frac)")

    def saved(self):
        """What a checkpoint keeps of them."""
        return dict(steps=self.steps, first=self.first)

    def summary(self, step):
        """The line a run that skipped steps ends with."""
        return (f"nonfinite=skip: {self.steps} of the run's {step} steps were skipped (non-finite "
                f"loss or gradient norm), the first at step {self.first}")


def check_step_finite(step, record, model, device, ckpt_path, saved):
    """RunError, on every rank alike, where the weights or the evaluation's loss are not finite.
    out_dir keeps the checkpoints of the last good step (`saved`: its step, or None)."""
    bad, count = nonfinite_model_tensors(model, device)
    if bad:
        what = (f"the weights are not finite after the optimizer step: {len(bad)} of the model's "
                f"{count} float tensors hold NaN or infinity, the first {bad[0]}")
    elif not math.isfinite(record.get('val_loss', 0.0)):
        what = f"the validation loss is {record['val_loss']} (the weights are finite)"
    else:
        return
    kept = (f"out_dir's checkpoints are left as they were ({ckpt_path}: step {saved}). To continue "
            f"from it {LOWER_LR}" if saved else
            "this run saved no checkpoint before it; start again with a lower --learning_rate")
    raise RunError(f"step {step}: {what}; stopping without saving: {kept}")


def import_wandb():
    """The wandb module, imported before anything is written."""
    try:
        import wandb
    except ImportError:
        raise RunError("wandb_log=True needs the wandb package, which is not installed: pip "
                       "install wandb (then wandb login), or --wandb_log=False") from None
    return wandb


class Metrics:
    """Where rank 0 writes a run's records: out_dir/metrics.jsonl (every step, and events), the
    console (every log_interval steps, and every evaluation) and wandb (the module, or None)."""

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
