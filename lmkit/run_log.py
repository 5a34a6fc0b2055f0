"""
Where a train.py run's records go (Metrics): out_dir/metrics.jsonl, a JSON record per step that a resume cuts back
to its checkpoint's step, the console every log_interval steps and every evaluation, and wandb (imported before any
work: import_wandb); and out_dir/config.json. A run that starts fresh never replaces a log: an earlier one is kept
aside under a new name (files.set_aside), said in one line. Rank 0 alone writes.
"""
import json
import math
import os
import statistics
import sys

from lmkit.errors import RunError
from lmkit.files import atomic_write, read_log, set_aside, write_json


def duration(seconds):
    """2h05m, 3m07s: a time left, at the steps' recent pace."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def last_logged(out_dir):
    """(the last step out_dir/metrics.jsonl records, whether that step's loss is finite); (0, True) without one.
    Read from the end in growing blocks: an evaluation's line (every head's measures) can be longer than any fixed
    tail."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    try:
        with open(path, 'rb') as f:
            size, block = f.seek(0, os.SEEK_END), 4096
            while True:
                f.seek(max(0, size - block))
                lines = f.read().splitlines()[0 if block >= size else 1:]  # a block's first line may be cut
                for line in reversed(lines):
                    try:
                        record = json.loads(line)
                        return record['step'], math.isfinite(record.get('loss', 0.0))
                    except (ValueError, KeyError, TypeError):
                        continue
                if block >= size:
                    break
                block *= 8
    except OSError:
        pass
    return 0, True


def import_wandb():
    """The wandb module, imported before anything is written: wandb_log=True without it stops with nothing left."""
    try:
        import wandb
    except ImportError:
        raise RunError("wandb_log=True needs the wandb package, which is not installed: pip install wandb (then "
                       "wandb login), or --wandb_log=False") from None
    return wandb


class Metrics:
    """Where the run's records go: out_dir/metrics.jsonl (every step), the console (every log_interval steps and
    every evaluation) and wandb (the module, or None); rank 0 only. Also writes out_dir/config.json. A run that
    starts fresh never replaces a log: an earlier one (its checkpoints deleted, or replaced by overwrite=True) is
    kept aside under a new name (files.set_aside).
    A record with an 'event' (a resume that changed the learning rate) goes to metrics.jsonl only."""

    def __init__(self, c, run, start_step, wandb=None):
        self.c, self.on, self.wandb = c, run.master, wandb
        self.dts = []  # the steps' times since the last console line: its estimate of the time left
        self.path = os.path.join(c['out_dir'], 'metrics.jsonl')
        if not self.on:
            return
        kept = []  # on resume, the records up to the checkpoint's step (a crash may have left later ones)
        if start_step and os.path.isfile(self.path):
            kept = [record for record in read_log(self.path) if record['step'] <= start_step]
        elif os.path.isfile(self.path) and os.path.getsize(self.path):  # a start with no checkpoint to continue
            print(f"note: {self.path} holds the log of an earlier run in {c['out_dir']}, which this one does not "
                  f"continue: kept as {set_aside(self.path)}; a new log begins", file=sys.stderr, flush=True)
        write_json(os.path.join(c['out_dir'], 'config.json'), c)
        with atomic_write(self.path) as f:
            f.writelines(json.dumps(record) + '\n' for record in kept)
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
            print(f"step {record['step']}/{self.c['max_iters']} | loss {record['loss']:.4f}{val} | lr "
                  f"{record['lr']:.2e} | grad {record['grad_norm']:.3f} | {record['tokens_per_sec']:,.0f} tok/s | mfu "
                  f"{100 * record['mfu']:.2f}% | {1000 * record['dt']:.0f} ms | ETA {duration(left)}", flush=True)
