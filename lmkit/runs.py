"""
A training run read back for its analyses: its metrics.jsonl and config (load_run), its gradient-norm spikes as the
paper's Table 5 counts them (spike_counts: median + k MAD over a window of steps), and matplotlib set up for figures
(pyplot).
"""
import json
import math
import os

import numpy as np

from lmkit.errors import RunError
from lmkit.files import read_log
from model import FIELD_NAMES, GATED_NAMES, ModelConfig


def pyplot():
    import matplotlib
    matplotlib.use('Agg')  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def grad_norm_statistics(grad_norms, start=0, end=500):
    """Table 4 over steps [start, end) of the raw (unclipped) gradient norms: mean, standard deviation and
    variance (population, ddof = 0) and the coefficient of variation std / mean."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    mean, std = g.mean(), g.std()
    return dict(mean=mean, std=std, variance=std ** 2, cv=std / mean if mean else math.nan)


def spike_counts(grad_norms, ks=(6, 9), start=0, end=500):
    """Table 5: the number of steps in [start, end) whose gradient norm exceeds median(g) + k * MAD(g), with
    MAD(g) = median(|g - median(g)|), the raw median absolute deviation (no 1.4826 normal-consistency factor;
    the paper does not give one)."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    median = np.median(g)
    mad = np.median(np.abs(g - median))
    return {k: int((g > median + k * mad).sum()) for k in ks}


def load_run(out_dir):
    """A train.py run: its metrics.jsonl step records (files.read_log; events, such as a resume's learning-rate
    change, left out) and config.json (the resolved training and model config). A log holding a step twice (two
    writers at once, or logs pasted together) is refused: its statistics would count those steps twice."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        raise RunError(f"{out_dir}: no metrics.jsonl (not a train.py out_dir)")
    records, lines = [], {}
    for number, record in enumerate(read_log(path), 1):
        if 'event' in record:
            continue
        if record['step'] in lines:
            raise RunError(f"{path}: step {record['step']} is on lines {lines[record['step']]} and {number}: two "
                           f"train.py wrote this log at once (before runs were locked) or logs were joined; keep "
                           f"one record per step (one run's lines) and run analyze.py again")
        lines[record['step']] = number
        records.append(record)
    if not records:
        raise RunError(f"{path}: empty (the run has not finished a step)")
    config_path = os.path.join(out_dir, 'config.json')
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    return dict(dir=out_dir, config=config, records=records, method=method_name(config), objective=objective(config))


def method_name(config):
    """The paper's name for a model config (a dict): its variant's display name (Variant.display; GATED_NAMES' with the
    gate), then its options (Variant.options), so that the sigmoid ablation of Table 3 says so."""
    config = ModelConfig(**{key: value for key, value in config.items() if key in FIELD_NAMES})
    of = config.variant_name
    name = config.variant.display or of
    if config.is_gated:  # the paper's name for it with the gate, if the paper has one
        name = next((shown for base, shown in GATED_NAMES.values() if base == of), f'{name} + Gated')
    return name + config.variant.options(config)


def objective(config):
    """What a run minimised: 'CE' (cross-entropy on the data), or 'KD from <teacher>' with kd_alpha and
    kd_temperature where they are not the paper's 1.0. Losses of different objectives are not comparable."""
    if not config.get('teacher'):
        return 'CE'
    settings = ''.join(f", {key}={config[key]}" for key in ('kd_alpha', 'kd_temperature')
                       if config.get(key, 1.0) != 1.0)
    return f"KD from {config['teacher']}{settings}"
