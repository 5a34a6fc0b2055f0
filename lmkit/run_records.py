"""
A train.py run read back: its records (load_run), the names the analyses' tables and figures
give it: the paper's name for its model (method_name, from DISPLAY_NAMES and OPTIONS) and what it
minimised (objective), and what a planned train.py command would do beside the checkpoint its
out_dir holds (planned_run, for the quick start and the sink study). train.py reads none of it.
"""
import dataclasses
import json
import os

from lmkit.checkpoint import read_checkpoint
from lmkit.distributed import resolve_device, resolve_dtype
from lmkit.errors import RunError
from lmkit.files import read_log
from lmkit.runs import changed_settings, checkpoint_path, load_config, recorded_config, run_config
from model import BASELINE, FIELD_NAMES, GATED_NAMES, ModelConfig


def load_run(out_dir):
    """A train.py run: its metrics.jsonl step records (no events) and config.json's RunConfig (or
    None). A log holding a step twice (two writers, or logs joined) is refused."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        raise RunError(f"{out_dir}: no metrics.jsonl (not a train.py out_dir)")
    records, lines = [], {}
    for number, record in enumerate(read_log(path), 1):
        if 'event' in record:
            continue
        if record['step'] in lines:
            raise RunError(f"{path}: step {record['step']} is on lines {lines[record['step']]} and "
                           f"{number}: two train.py wrote this log at once (before runs were "
                           "locked) or logs were joined; keep one record per step (one run's "
                           "lines) and run analyze.py again")
        lines[record['step']] = number
        records.append(record)
    if not records:
        raise RunError(f"{path}: empty (the run has not finished a step)")
    config_path = os.path.join(out_dir, 'config.json')
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    return dict(dir=out_dir, config=run_config(config) if config else None, records=records,
                method=method_name(config), objective=objective(run_config(config)))


# The paper's names for its models (Tables 1-3), and ours for the others, by their value of
# --attention; the analyses' tables and figures show them. A name without an entry shows as itself.
DISPLAY_NAMES = {'softmax': 'Baseline', 'sink': 'Sink', 'affine': 'Affine-Scaled',
                 'softmax1': 'Off-by-One', 'gated': 'Gated',
                 'affine_gated': 'Affine-Scaled + Gated', 'headwise_gated': 'Head-wise Gated'}
# What the tables add after a variant's name, by its key in model.VARIANTS (Table 3's sigmoid
# ablation); a variant without an entry adds nothing.
OPTIONS = {'affine': lambda c: '' if c.affine_act == 'linear_clip' else f' ({c.affine_act})'}


def variant_options(config):
    """What the tables add after the name of a ModelConfig's variant (OPTIONS)."""
    return OPTIONS.get(config.variant_name, lambda c: '')(config)


def method_name(config):
    """The paper's name for a model config (a dict): its display name (DISPLAY_NAMES), with the
    gate where the gated model has no name of its own ('Sink + Gated'), then its options."""
    config = ModelConfig(**{key: value for key, value in config.items() if key in FIELD_NAMES})
    of, gate = config.variant_name, config.gate_kind
    name = DISPLAY_NAMES.get(of, of)
    if config.is_gated:
        named = {(g.base, g.gate): DISPLAY_NAMES.get(n, n) for n, g in GATED_NAMES.items()}
        name = named.get((of, gate), f"{name} + {named[BASELINE, gate]}")
    return name + variant_options(config)


def objective(config):
    """What a run (its RunConfig) minimised: 'CE', or 'KD from <teacher>' with kd_alpha and
    kd_temperature where they are not the paper's 1.0. Losses of different objectives are not
    comparable."""
    if not config.teacher:
        return 'CE'
    settings = ''.join(f", {key}={getattr(config, key)}" for key in ('kd_alpha', 'kd_temperature')
                       if getattr(config, key) != 1.0)
    return f"KD from {config.teacher}{settings}"


# -----------------------------------------------------------------------------
# What the quick start and the sink study plan

RESTART = ['--init_from=scratch', '--overwrite=True']


def restart_note(out_dir, changes):
    """What the quick start and the sink study say of a run they train again (RESTART)."""
    return (f"changed since {out_dir} was trained: {'; '.join(changes)}. Training it again from "
            "scratch, replacing its checkpoint and config.json (its metrics.jsonl is kept aside, "
            "under a new name)")


def planned_run(argv, cwd=''):
    """(RunConfig, step, changes) of the train.py command argv (run in cwd) beside its out_dir's
    checkpoint: the step it reached (None: none), and changed settings, max_iters among them."""
    now = run_config(load_config(argv))
    # the dtype as train.py's setup_run resolves it
    now = dataclasses.replace(now, dtype=resolve_dtype(now.dtype, resolve_device(now.device)))
    path = checkpoint_path(os.path.join(cwd, now.out_dir))
    if not os.path.exists(path):
        return now, None, []
    then = read_checkpoint(path, keys=('step', 'config'))
    changed = changed_settings(recorded_config(then['config'])[0], dataclasses.asdict(now),
                               also=('max_iters',))
    return now, then['step'], [f"{key} {old!r} -> {new!r}" for key, old, new in changed]
