"""
The paper's analyses (Section 4, Appendix A-B).

    python analyze.py runs out/softmax_1b out/sink_1b out/affine_1b --out_dir=analysis/1b_runs

`runs` reads train.py's metrics.jsonl of several runs of one model size and writes, into --out_dir, the
curves of Figures 2, 7, 8 and 10 (PNG, runs overlaid and labelled by variant), Tables 4-5 (gradient-norm
statistics and spike counts over a window of steps), numbers.json with every number behind them, and
report.md embedding both. matplotlib is needed for the figures (pip install matplotlib).

From a model (explicit weights of Attention.weights, never the training path), attention_statistics gives
per layer: first-token weight (Figure 4), per-query row sums (Figure 3), per-head total weight (Figure 5),
entropy (Figure 6), a head-averaged corner of the matrix (Figure 9), alpha / alpha_ma / sinks. (Its command,
and Tables 1-3 from evaluation results, are still to come.)
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch

from model import rope_cos_sin


@torch.no_grad()
def attention_statistics(model, idx, corner=30):
    """Per-layer statistics of the effective attention weights on the sequences idx (B, T), B*T <= the model's
    block_size each. Weights come from each layer's Attention.weights on the inputs the model's own forward
    gives that layer (eval mode, so affine's alpha_ma is untouched). Definitions, for weights w (B, H, T, T):
      first_token: w[:, :, i, 0] averaged over heads, sequences and queries i >= 1 (query 0 sees only token 0);
      row_sums:    sum_j w_ij per query, averaged over heads (every query of every sequence; Figure 3's histogram);
      head_total:  per head, the mean row sum (Figure 5; normalise for display);
      entropy:     -sum_j p_ij log p_ij with p_ij = |w_ij| / sum_j |w_ij|, averaged over heads, sequences and
                   queries i >= 1. Affine weights can be negative and rows need not sum to 1, so the entropy is
                   that of the distribution of attention *magnitude* over the visible keys; for softmax it is
                   the usual entropy, for sink that of the weights renormalised without the sink's mass;
      corner:      the head-averaged top-left corner x corner block of sequence 0 (Figure 9)."""
    layers = [layer.self_attn for layer in model.model.layers]
    inputs = []
    hooks = [a.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for a in layers]
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    T = idx.size(1)
    positions = torch.arange(T, device=idx.device)
    cos, sin = rope_cos_sin(model.config, positions)
    stats = []
    for attn, x in zip(layers, inputs):
        w = attn.weights(x, cos, sin, positions).double()
        p = w.abs() / w.abs().sum(-1, keepdim=True).clamp_min(1e-30)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # (B, H, T)
        stats.append(dict(
            first_token=w[:, :, 1:, 0].mean().item(),
            row_sums=w.sum(-1).mean(1).flatten().tolist(),
            head_total=w.sum(-1).mean(dim=(0, 2)).tolist(),
            entropy=entropy[:, :, 1:].mean().item(),
            corner=w[0, :, :corner, :corner].mean(0).tolist(),
        ))
        if hasattr(attn, 'alpha_ma'):
            stats[-1]['alpha'] = attn.scale(x).mean(dim=(0, 1)).tolist()  # per head, mean over tokens
            stats[-1]['alpha_ma'] = attn.alpha_ma.tolist()
        if hasattr(attn, 'sinks'):
            stats[-1]['sinks'] = attn.sinks.tolist()
    return stats


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


# -----------------------------------------------------------------------------
# From training runs: figures 2, 7, 8, 10 and tables 4-5


def load_run(out_dir):
    """A train.py run: its metrics.jsonl records, config.json, and a label (the attention variant)."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        raise SystemExit(f"{out_dir}: no metrics.jsonl (not a train.py out_dir)")
    with open(path) as f:
        records = [json.loads(line) for line in f]
    config_path = os.path.join(out_dir, 'config.json')
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    return dict(dir=out_dir, label=config.get('attention', os.path.basename(os.path.normpath(out_dir))),
                config=config, records=records)


def plot(path, runs, y_key, title, ylabel, first_step=0, logy=False):
    """One figure: y_key over steps for every run that logged it, overlaid."""
    import matplotlib
    matplotlib.use('Agg')  # files only, no display
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        points = [(r['step'], r[y_key]) for r in run['records'] if y_key in r and r['step'] > first_step]
        if points:
            ax.plot(*zip(*points), label=run['label'], linewidth=1)
    ax.set(title=title, xlabel='step', ylabel=ylabel)
    if logy:
        ax.set_yscale('log')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def runs_report(run_dirs, out_dir, window=(0, 500), ks=(6, 9), late=2000):
    """Figures 2, 7, 8, 10 and Tables 4-5 for runs of one model size, written to out_dir all at once (built in
    a temporary directory first, so a failure leaves no half-written report)."""
    runs = [load_run(d) for d in run_dirs]
    shapes = {(r['config'].get('n_layer'), r['config'].get('n_embd')) for r in runs}
    if len(shapes) > 1:
        raise SystemExit(f"runs of different model sizes (n_layer, n_embd) {sorted(shapes, key=str)} in one report; "
                         f"analyse each size separately")
    numbers, loss_key = {}, 'kd_loss' if all('kd_loss' in r['records'][0] for r in runs if r['records']) else 'loss'
    for run in runs:
        g = [r['grad_norm'] for r in run['records']]
        try:
            stats, spikes = grad_norm_statistics(g, *window), spike_counts(g, ks, *window)
        except ValueError as e:
            raise SystemExit(f"{run['dir']}: {e}") from None
        numbers[run['dir']] = dict(label=run['label'], steps=len(g), final_loss=run['records'][-1][loss_key],
                                   grad_norm=stats, spikes={str(k): n for k, n in spikes.items()})
    tmp = out_dir.rstrip('/') + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    last = max(len(r['records']) for r in runs)
    figures = [('fig7_loss.png', loss_key, f"Figure 7: {loss_key.replace('_', ' ')}", loss_key, 0, True),
               ('fig10_loss_late.png', loss_key, f"Figure 10: {loss_key.replace('_', ' ')}, last {late} steps",
                loss_key, max(0, last - late), False),
               ('fig8_grad_norm.png', 'grad_norm', 'Figure 8: gradient norm (before clipping)', 'grad norm', 0, True),
               ('fig2_attn_logit.png', 'attn_logit_mean', 'Figure 2: mean attention logit q.k/sqrt(d)', 'mean logit',
                0, False)]
    for name, key, title, ylabel, first, logy in figures:
        plot(os.path.join(tmp, name), runs, key, title, ylabel, first, logy)
    with open(os.path.join(tmp, 'numbers.json'), 'w') as f:
        json.dump(dict(window=list(window), ks=list(ks), runs=numbers), f, indent=1)
    lo, hi = window
    run_list = ', '.join(f"`{d}` ({n['label']})" for d, n in numbers.items())
    lines = ['# Training runs', '', f"Runs: {run_list}.", '',
             f"## Table 4: gradient-norm statistics, steps {lo}-{hi} (raw norms, before clipping)", '',
             '| run | mean | std | variance | CV |', '|---|---|---|---|---|']
    lines += [f"| {n['label']} | {n['grad_norm']['mean']:.3f} | {n['grad_norm']['std']:.3f} | "
              f"{n['grad_norm']['variance']:.3f} | {n['grad_norm']['cv']:.2f} |" for n in numbers.values()]
    lines += ['', f"## Table 5: gradient-norm spikes, steps {lo}-{hi} (g > median + k MAD)", '',
              '| run | ' + ' | '.join(f'k={k}' for k in ks) + ' |', '|---|' + '---|' * len(ks)]
    lines += [f"| {n['label']} | " + ' | '.join(str(n['spikes'][str(k)]) for k in ks) + ' |' for n in numbers.values()]
    lines += ['', '## Figures', ''] + [f"![{title}]({name})" for name, _, title, *_ in figures]
    with open(os.path.join(tmp, 'report.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return numbers


def main(argv=None):
    p = argparse.ArgumentParser(description="The paper's analyses from training runs.", allow_abbrev=False)
    jobs = p.add_subparsers(dest='job', required=True)
    runs = jobs.add_parser('runs', allow_abbrev=False, help="Figures 2, 7, 8, 10 and Tables 4-5 from metrics.jsonl")
    runs.add_argument('run_dirs', nargs='+', help="train.py out_dirs of one model size")
    runs.add_argument('--out_dir', required=True)
    runs.add_argument('--window', default='0,500', help="steps for Tables 4-5: start,end (the paper: 0,500)")
    runs.add_argument('--ks', default='6,9', help="spike thresholds k in median + k MAD (the paper: 6,9)")
    runs.add_argument('--late', type=int, default=2000, help="steps in Figure 10's late-phase zoom")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        window, ks = tuple(int(v) for v in args.window.split(',')), tuple(float(v) for v in args.ks.split(','))
    except ValueError:
        p.error(f"--window and --ks are comma-separated numbers, got {args.window!r} and {args.ks!r}")
    numbers = runs_report(args.run_dirs, args.out_dir, window, tuple(int(k) if k.is_integer() else k for k in ks),
                          args.late)
    print(f"wrote {args.out_dir}/report.md, numbers.json and 4 figures for {len(numbers)} runs")


if __name__ == '__main__':
    main()
