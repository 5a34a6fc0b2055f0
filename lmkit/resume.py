"""
Continuing a run from its checkpoint: the one rule for what may change (RESUME_MAY_CHANGE, changed_settings), which
train.py's resume checks and the quick start's and the sink study's plans apply (training.planned_run); the checkpoint
a run continues (checkpoint_to_resume); what makes the continuation bit-exact (the RNG state, the data's fingerprint).
"""
import dataclasses
import os
import random

import numpy as np
import torch

from lmkit.checkpoint import CKPT_KEYS, CheckpointError, previous_checkpoint, read_checkpoint
from lmkit.errors import RunError

# What may differ between a checkpoint's run and the run that continues it: nothing here changes what a step
# computes (the data of step s depends only on (seed, s, global_batch_size), not on the ranks or the micro-batch).
# max_iters may grow to extend a run; note that with decay_frac > 0 the decay then starts later than it would have.
# Every other training key, and the model, must be the same; data_dir may move, but must hold the same data.
RESUME_MAY_CHANGE = {'out_dir', 'data_dir', 'init_from', 'overwrite', 'keep_previous', 'max_iters', 'micro_batch_size',
                     'eval_interval', 'eval_batches', 'log_interval', 'nonfinite', 'max_skipped_frac', 'device',
                     'compile', 'peak_flops', 'wandb_log', 'wandb_project', 'wandb_run_name', 'kd_loss', 'fsdp',
                     'activation_checkpointing', 'dry_run', 'dry_run_world_size', 'dry_run_gpu_gib', 'resume_lr_change',
                     'attention_windows'}
# What a resume may change only when asked to (resume_lr_change=True): the continued run is then not the same run,
# so the change is recorded in metrics.jsonl, at the first step it applies to.
LR_KEYS = ('learning_rate', 'min_lr')


RESTART = ['--init_from=scratch', '--overwrite=True']  # train.py's arguments that train a run again from scratch


def restart_note(out_dir, changes):
    """What the quick start and the sink study say of a run they train again from scratch (RESTART)."""
    return (f"changed since {out_dir} was trained: {'; '.join(changes)}. Training it again from scratch, replacing its "
            f"checkpoint and config.json (its metrics.jsonl is kept aside, under a new name)")



def recorded_config(config, defaults):
    """A checkpoint's config (its dict) with every key added since it was written at its default, and those keys
    (defaults: train.py's keys' defaults): a key is added with the default that does what the code did before it, so
    that is what the checkpoint's run did."""
    missing = [key for key in defaults if key not in config]
    return {**config, **{key: defaults[key] for key in missing}}, missing


def changed_settings(old, new, also=()):
    """[(key, old value, new value)] of the settings (dicts) whose change makes a continued run another run: every key
    outside RESUME_MAY_CHANGE, and those of `also`. The one rule for continuing a run: train.py's resume
    (check_resumable), and the quick start's and the sink study's plans (training.planned_run, with
    also=('max_iters',))."""
    return [(key, old[key], new[key]) for key in sorted(new)
            if (key in also or key not in RESUME_MAY_CHANGE) and old[key] != new[key]]


def check_resumable(ckpt, c, model_config, data_meta, path, defaults):
    """RunError listing everything that would make continuing the checkpoint `ckpt` with config `c` differ from the
    run that wrote it: the model, a training key outside RESUME_MAY_CHANGE, or the data (its tokenizer and size).
    Returns the keys the checkpoint predates, taken at their defaults (recorded_config)."""
    old, missing = recorded_config({**ckpt['config'], **ckpt['model_config']}, defaults)
    changed = [f"{key}: {before!r} -> {after!r}" for key, before, after in
               changed_settings(old, {**c, **dataclasses.asdict(model_config)})]
    if ckpt['data'] != data_fingerprint(data_meta):
        changed.append(f"the data: {ckpt['data']} -> {data_fingerprint(data_meta)} (data_dir={c['data_dir']})")
    if changed:
        raise RunError(f"{path} was written by a different run; continuing it with these settings would not be the "
                       f"same run:\n  - " + "\n  - ".join(changed) + f"\nKeys that may change on resume: "
                       f"{', '.join(sorted(RESUME_MAY_CHANGE))}; {' and '.join(LR_KEYS)} with --resume_lr_change=True "
                       f"(recorded in metrics.jsonl). To start a new run instead: another --out_dir, or "
                       f"--init_from=scratch --overwrite=True.")
    return {key: old[key] for key in missing}


def lr_changes(ckpt, c):
    """{key: {'from': the checkpoint's, 'to': this run's}} of the LR_KEYS that this resume changes, where
    resume_lr_change=True allows it (else {}: check_resumable then refuses a change)."""
    if not c['resume_lr_change']:
        return {}
    return {key: {'from': ckpt['config'][key], 'to': c[key]} for key in LR_KEYS if ckpt['config'][key] != c[key]}


def data_fingerprint(meta):
    """What identifies a prepare_data.py directory's contents (its meta.json): the tokenizer and each split's size."""
    return dict(tokenizer=meta['tokenizer']['sha256'],
                **{f'{split}_tokens': info['tokens'] for split, info in sorted(meta['splits'].items())})


def rng_state():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state):
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if state['cuda'] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def checkpoint_to_resume(c, ckpt_path):
    """out_dir's checkpoint if this run continues it (init_from), else None; refuses to replace one unasked."""
    exists, previous = os.path.isfile(ckpt_path), previous_checkpoint(ckpt_path)
    if not exists and os.path.isfile(previous) and not c['overwrite']:
        raise RunError(f"{previous} is there without {ckpt_path}: to continue from it, mv {previous} {ckpt_path}; "
                       f"to start over (replacing it): --init_from=scratch --overwrite=True")
    if c['init_from'] == 'resume' and not exists:
        raise RunError(f"init_from=resume: no checkpoint at {ckpt_path}")
    if not exists:
        return None
    try:
        ckpt = read_checkpoint(ckpt_path, keys=CKPT_KEYS)
    except CheckpointError as e:
        raise RunError(f"init_from={c['init_from']}: {e} (--init_from=scratch --overwrite=True starts the run over)")
    if c['init_from'] == 'scratch' and not c['overwrite']:
        raise RunError(f"{ckpt_path} holds a run at step {ckpt['step']}, which init_from=scratch would replace at "
                       f"its first save. To continue it: --init_from=auto (the default). To start over and "
                       f"replace it: --init_from=scratch --overwrite=True. Or choose another --out_dir.")
    return None if c['init_from'] == 'scratch' else ckpt
