"""The paper's analyses (Section 4, Appendix A-B) and its tables, one command per job, each writing
PNG figures, numbers.json with every number behind them and report.md into --out_dir:

    python analyze.py attention out/softmax_1b out/sink_1b out/affine_1b --out_dir=analysis/1b_attn
    python analyze.py runs out/softmax_1b out/sink_1b out/affine_1b --out_dir=analysis/1b_runs
    python analyze.py table out/softmax_1b out/sink_1b out/affine_1b --out_dir=analysis/1b_table

attention: Figures 3-6 and 9, alpha, sinks and the sink's measures, from checkpoints; runs: Figures
2, 7, 8, 10 and Tables 4-5 from metrics.jsonl; table: Tables 1-3. docs/analysis.md has each job.
"""
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import numpy as np
import torch

from lmkit.checkpoint import CKPT_NAME, checkpoint_file, read_checkpoint
from lmkit.progress import Progress
from lmkit.distributed import resolve_device
from configurator import DEVICE, Key, fail, parse
from lmkit.run_records import load_run, method_name
from lmkit.stats import grad_norm_statistics, pyplot, spike_counts
from lmkit.files import MARKERS, claim_dir, made_dirs, write_json
from lmkit.errors import RunError, run_script
from lmkit.zeroshot import C4_DOCS, HubUnreachable, c4_tokens, read_rows
from lmkit.loading import load_model_and_tokenizer, window_first_token
from lmkit.data import Windows, read_meta, read_split
from model import FIELD_NAMES, GPT, ModelConfig
from lmkit.sink_costs import (GU_LENGTH, GU_SAMPLES, knockout_losses, model_statistics,
                              sink_rates, w8a8_losses)
from lmkit.stats import mean_std
from lmkit.tokenizer import tokenizer_info


def check_writable(path):
    """Raise an OSError naming path before any work if no file can be written there, by making and
    removing a file in the nearest directory at or above path that exists."""
    top = os.path.abspath(path)
    while not os.path.exists(top):
        top = os.path.dirname(top)
    try:
        fd, probe = tempfile.mkstemp(dir=top, prefix='.writable.')
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None  # the path asked for, not the probe's
    os.close(fd)
    os.remove(probe)


def is_report(names):
    """Whether a directory holding these names is an earlier output of analyze.py: its report and
    numbers, and no other tool's outputs."""
    return {'report.md',
            'numbers.json'} <= names and not names & (set(MARKERS) - {'report.md', 'numbers.json'})


def write_report(out_dir, build):
    """build(tmp) writes every output into a fresh temporary directory inside out_dir; they then
    replace the files of the same names one by one, report.md last, so a failure before that leaves
    the previous report in place. numbers.json records the files written (the previous report's that
    are not written again are removed); no other file in out_dir is touched."""
    tmp = os.path.join(out_dir, '.analyze.tmp')
    shutil.rmtree(tmp, ignore_errors=True)  # our own, left by a crash
    with made_dirs(out_dir):  # out_dir, the first time: removed again if the report fails
        os.mkdir(tmp)
        try:
            result = build(tmp)
            written = sorted(os.listdir(tmp))
            with open(os.path.join(tmp, 'numbers.json')) as f:
                numbers = json.load(f)
            previous = []
            if os.path.isfile(os.path.join(out_dir, 'numbers.json')):
                with open(os.path.join(out_dir, 'numbers.json')) as f:
                    previous = json.load(f).get('files', [])
            write_json(os.path.join(tmp, 'numbers.json'), dict(numbers, files=written))
            for name in sorted(written, key=lambda name: name == 'report.md'):
                os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
            for name in set(previous) - set(written):
                if os.path.isfile(os.path.join(out_dir, name)):
                    os.remove(os.path.join(out_dir, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


# -----------------------------------------------------------------------------
# From checkpoints: Figures 3, 4, 5, 6, 9, alpha and sink logits


def heldout_text(source, enc, tokenizer_sha256, data_dir=None, c4=None):
    """windows(seq_len) -> (count, get, what): the non-overlapping windows of seq_len tokens of a
    held-out token stream, how many there are (0 where the text is shorter than one), get(picks) ->
    those windows as a (k, seq_len) int64 tensor, and what the text is (for messages). 'c4' is the
    first 1100 C4 validation documents of the c4-new protocol (eval_zeroshot.py; offline from
    --data_dir, exported with eval_zeroshot.py --export_data; c4: the (rows, where) of read_rows
    where they are read already); a prepare_data.py directory gives its val split (it must be
    tokenized with the model's tokenizer); a UTF-8 text file is tokenized with the model's
    tokenizer. The text is read once, for windows of any length."""
    if source == 'c4':
        rows, where = c4 or read_rows('c4', data_dir, C4_DOCS)
        ids = np.asarray(c4_tokens(enc, rows, where), dtype=np.int64)
    elif os.path.isdir(source):
        meta = read_meta(source)
        if meta['tokenizer']['sha256'] != tokenizer_sha256:
            raise RunError(f"--data={source} was tokenized with {meta['tokenizer']['spec']}, not "
                           "the model's tokenizer; prepare it with the model's, or pass a text "
                           "file")
        return lambda seq_len: split_windows(source, seq_len)
    elif os.path.isfile(source):
        ids = np.asarray(enc.encode_ordinary(read_text(source)), dtype=np.int64)
    else:
        raise RunError(f"--data={source}: not 'c4', a prepare_data.py directory or a text file")

    def windows(seq_len):
        n = len(ids) // seq_len
        return n, lambda picks: torch.from_numpy(ids[:n * seq_len].reshape(n, seq_len)[picks]), \
            f"{source} ({len(ids):,} tokens)"
    return windows


def split_windows(source, seq_len):
    """heldout_text's windows of a prepare_data.py directory's val split: none where every shard is
    shorter than a window, which data.Windows refuses."""
    what = f"{source}'s val split"
    try:
        windows = Windows(source, 'val', seq_len)
    except RunError:
        if any(len(shard) > seq_len for shard in read_split(source, 'val')):
            raise  # not for want of tokens: a shard is missing or damaged
        return 0, None, what
    return len(windows), lambda picks: torch.from_numpy(windows.get(picks)[0]), what


def read_text(path):
    """A --data text file's text: UTF-8 and not empty, else a one-line RunError that says what to
    do."""
    with open(path, 'rb') as f:
        data = f.read()
    if not data:
        raise RunError(f"--data={path}: empty (0 bytes); give a file that holds held-out text")
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        raise RunError(f"--data={path}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                       f"{e.start:,} (line {line}); convert a Latin-1 text with iconv -f latin1 -t "
                       f"utf-8 {path} > <new file> and pass that (a binary file cannot be "
                       "analysed)") from None


def c4_validation(data_dir, spec, tokenizer):
    """read_rows' (rows, where) of the c4-new documents, read before any model is loaded: offline
    (the hub cannot be reached) a one-line error in seconds, with the commands that give local text
    instead."""
    try:
        return read_rows('c4', data_dir, C4_DOCS)
    except HubUnreachable as e:
        path = checkpoint_file(spec)
        tok = tokenizer or (read_checkpoint(path, keys=('tokenizer',))['tokenizer']['spec'] if path
                            else spec)
        raise RunError(f"--data=c4 reads C4 validation from the hub, and {e.reason}; analyse local "
                       "text instead: the built-in corpus in the model's tokens (python "
                       f"prepare_data.py --source=builtin --tokenizer={tok} --val_every=10 "
                       "--out_dir=data/heldout, then --data=data/heldout), or --data=<a UTF-8 text "
                       "file>; or export C4 where the hub can be reached (python eval_zeroshot.py "
                       "--export_data=evaldata --tasks=c4) and pass --data_dir=evaldata") from None


def heldout_sequences(source, enc, tokenizer_sha256, num_seqs, seq_len, seed=0, data_dir=None):
    """num_seqs windows of seq_len tokens of the held-out text (heldout_text), drawn without
    replacement (seeded)."""
    count, get, what = heldout_text(source, enc, tokenizer_sha256, data_dir)(seq_len)
    return get(draw(count, num_seqs, seed, what, seq_len))


def windows_of(n, seq_len):
    """'1 window of 64 tokens', '3 windows of 64 tokens': for messages."""
    return f"{n} window{'s' * (n != 1)} of {seq_len} tokens"


def draw(n, k, seed, what, seq_len, key='num_seqs'):
    if n < k:
        raise RunError(f"{what} has {windows_of(n, seq_len)}, fewer than --{key}={k}; lower "
                       f"--{key} or --seq_len")
    return np.sort(np.random.default_rng(seed).choice(n, k, replace=False))


def starting_with(first, sequences):
    """The sequences with the token `first` put in front (their last token dropped), as the
    checkpoint's training windows all began (train.py --first_token); as they are where first is
    None."""
    if first is None:
        return sequences
    return torch.cat([torch.full_like(sequences[:, :1], first), sequences[:, :-1]], dim=1)


def sink_costs(model, windows, first, sequences, unread, seed, sink_samples, calibration,
               knockout_window, batch_size):
    """What the attention job measures at the end of each model (probes.py): Gu et al.'s Sink_1 in
    their own setting (gu_setting), W8A8 with its ranges from `calibration` windows drawn from those
    the analysis does not read (unread; w8a8_setting), and the first-token knockout on the analysed
    sequences. windows: heldout_text's; 0 skips the first two. Where the text is too short for one,
    it takes fewer windows or none, and `notes` says so."""
    costs, notes = dict(gu=None, w8a8=None), {}
    if sink_samples:
        costs['gu'], notes['gu'] = gu_setting(model, windows, first, sequences, seed, sink_samples,
                                              batch_size)
    if calibration:
        costs['w8a8'], notes['w8a8'] = w8a8_setting(model, windows, first, sequences, unread, seed,
                                                    calibration, batch_size)
    return costs | dict(knockout=knockout_losses(model, sequences, knockout_window,
                                                 batch_size=batch_size),
                        notes={key: note for key, note in notes.items() if note})


def gu_setting(model, windows, first, sequences, seed, sink_samples, batch_size):
    """(Gu et al.'s Sink_1 on sink_samples windows of GU_LENGTH tokens (shorter where the model's
    block is; fewer where the text has fewer, as many tokens per forward as the analysis's), a note
    where it took fewer or none)."""
    length = min(GU_LENGTH, model.config.block_size)
    count, get, what = windows(length)
    if not count:
        return None, f"Gu et al.'s setting: skipped: {what} has no window of {length} tokens"
    picks = draw(count, min(sink_samples, count), seed, what, length, 'sink_samples')
    per_forward = batch_size * max(1, sequences.size(1) // length)
    note = None if count >= sink_samples else (f"Gu et al.'s setting: {windows_of(count, length)}, "
                                               f"fewer than --sink_samples={sink_samples}: {what} "
                                               "has no more")
    return sink_rates(model, starting_with(first, get(picks)), per_forward), note


def w8a8_setting(model, windows, first, sequences, unread, seed, calibration, batch_size):
    """(W8A8 (sink_costs.w8a8_losses) on the analysed sequences, its ranges fixed on `calibration`
    windows drawn from unread (fewer where there are fewer), a note where it took fewer or none)."""
    length = sequences.size(1)
    count, get, what = windows(length)
    if not len(unread):
        return None, (f"W8A8: skipped: {what} has {windows_of(count, length)}, all analysed, and "
                      f"W8A8 fixes its ranges on others (--calibration={calibration}); give a "
                      "longer text or a lower --num_seqs")
    k = min(calibration, len(unread))
    picks = unread[draw(len(unread), k, seed, f"{what} (beyond the analysed "
                                              "windows)", length, 'calibration')]
    note = None if k == calibration else (f"W8A8: ranges fixed on {windows_of(k, length)}, fewer "
                                          f"than --calibration={calibration}: {what} has no more "
                                          "beyond the analysed")
    return w8a8_losses(model, starting_with(first, get(picks)), sequences, batch_size), note


def attention_figures(out, models, layer):
    """Figures 3, 4, 5, 6, 9 and, where present, alpha and sink logits; returns [(file, title)]."""
    plt, figures = pyplot(), []

    def save(fig, name, title):
        fig.savefig(os.path.join(out, name), dpi=120)
        plt.close(fig)
        figures.append((name, title))

    save(row_sums_figure(plt, models), 'fig3_row_sums.png',
         'Figure 3: per-query attention weight sums (all layers, head-averaged)')
    for key, file, title in [('first_token', 'fig4_first_token.png', 'Figure 4: first-token '
                                                                     'attention weight'),
                             ('entropy', 'fig6_entropy.png', 'Figure 6: mean attention entropy')]:
        save(per_layer_figure(plt, models, key, title), file, title)
    save(first_token_share_figure(plt, models), 'fig_first_token_share.png',
         "Where each row's attention goes: the first token's share, the null mass and their sum, "
         "per layer")
    save(outliers_figure(plt, models), 'fig_outliers.png',
         'Activation outliers per layer (solid: every position; dashed: without position 0)')
    save(knockout_figure(plt, models), 'fig_knockout.png',
         'First-token knockout (StreamingLLM): loss with the first k positions and a recent window '
         'against full attention')
    save(head_total_figure(plt, models), 'fig5_head_total.png',
         'Figure 5: total attention weight per layer and head, min-max normalised to [0, 1]')
    save(heatmap_figure(plt, models, layer), f'fig9_heatmap_layer{layer}.png',
         f'Figure 9: attention weights of layer {layer}, head-averaged')
    affine = [name for name in models if 'alpha_ma' in models[name]['layers'][0]]
    if affine:
        save(alpha_figure(plt, models, affine), 'fig_alpha.png',
             'alpha (Eq. 7) per layer (box p25-p75, whiskers p5-p95, circles min and max) and '
             'alpha_ma (Eq. 9) per layer and head')
    sink = [name for name in models if 'sinks' in models[name]['layers'][0]]
    if sink:
        save(sinks_figure(plt, models, sink), 'fig_sinks.png', 'learned sink logits per layer and '
                                                               'head')
    return figures


def integer_ticks(*axes):
    """Ticks at whole numbers only, on each axis (layers and heads are counted)."""
    from matplotlib.ticker import MaxNLocator
    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def layer_numbers(models):
    """The x values of a per-layer plot: the layers of the models (all of one shape), counted from
    1."""
    return range(1, len(next(iter(models.values()))['layers']) + 1)


def side_by_side(plt, selected, rows=1):
    """(figure, axes): one column of `rows` panels per model in selected."""
    return plt.subplots(rows, len(selected), figsize=(4.5 * len(selected), 3.6 * rows),
                        squeeze=False, layout='constrained')


def layer_by_head(fig, ax, grid, title, **kw):
    """A (layer, head) grid as an image, both counted from 1."""
    grid = np.asarray(grid)
    image = ax.imshow(grid, aspect='auto',
                      extent=(0.5, grid.shape[1] + 0.5, grid.shape[0] + 0.5, 0.5), **kw)
    ax.set(title=title, xlabel='head', ylabel='layer')
    integer_ticks(ax.xaxis, ax.yaxis)
    fig.colorbar(image, ax=ax)


def row_sums_figure(plt, models):
    """Figure 3: each model's histogram of per-query attention weight sums, with their mean and
    median."""
    fig, axes = side_by_side(plt, models)
    for ax, name in zip(axes[0], models):
        r = models[name]['row_sums']
        ax.stairs(r['histogram']['counts'], r['histogram']['edges'], fill=True)
        ax.axvline(r['mean'], color='k', linestyle='--', label=f"mean {r['mean']:.3f}")
        ax.axvline(r['median'], color='r', linestyle='--', label=f"median {r['median']:.3f}")
        ax.set(title=name, xlabel='per-query attention weight sum', ylabel='queries')
        ax.legend(fontsize=7)
    return fig


def per_layer_figure(plt, models, key, title):
    """One per-layer measure (key), every model overlaid (Figures 4 and 6)."""
    fig, ax = plt.subplots(figsize=(6, 4), layout='constrained')
    x = layer_numbers(models)
    for name in models:
        ax.plot(x, [layer[key] for layer in models[name]['layers']], marker='o', label=name)
    ax.set(title=title, xlabel='layer', ylabel=key.replace('_', ' '))
    integer_ticks(ax.xaxis)
    ax.legend()
    return fig


def first_token_share_figure(plt, models):
    """Where each row's attention goes per layer: the first token's share, the null mass and their
    sum."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), layout='constrained')
    x = layer_numbers(models)
    panels = [('first_token_share', "first token's share of the row"), ('null_mass', 'null mass (1 '
                                                                                     '- row sum)'),
              ('first_or_null', 'first token or null')]
    for ax, (key, label) in zip(axes, panels):
        for name in models:
            ax.plot(x, [layer[key] for layer in models[name]['layers']], marker='o', label=name)
        ax.set(title=label, xlabel='layer')
        integer_ticks(ax.xaxis)
    axes[0].legend()
    return fig


def outliers_figure(plt, models):
    """Activation outliers per layer, log scale: every position solid, without position 0 dashed."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), layout='constrained')
    x = layer_numbers(models)
    for ax, (key, label) in zip(axes, [('attention_max_abs', "attention output's max |x|"),
                                       ('attention_kurtosis', "attention output's kurtosis"),
                                       ('residual_max_abs', "residual stream's max |x|")]):
        for i, name in enumerate(models):
            layers = models[name]['layers']
            ax.plot(x, [layer[key] for layer in layers], marker='o', color=f'C{i}', label=name)
            ax.plot(x, [layer[f'{key}_after_first'] for layer in layers], linestyle='--',
                    color=f'C{i}')
        ax.set(title=label, xlabel='layer', yscale='log')
        integer_ticks(ax.xaxis)
    axes[0].legend()
    return fig


def knockout_figure(plt, models):
    """The first-token knockout's losses, one group of bars per model: full attention, then each
    k."""
    names = list(models)
    knockout = [key for key in models[names[0]]['knockout'] if key == 'full'
                or key.startswith('first_')]
    fig, ax = plt.subplots(figsize=(6, 4), layout='constrained')
    for i, key in enumerate(knockout):
        ax.bar(np.arange(len(names)) + (i - len(knockout) / 2 + 0.5) * 0.8 / len(knockout),
               [models[name]['knockout'][key] for name in names], 0.8 / len(knockout),
               label='full attention' if key == 'full' else f"k = {key[6:]}")
    ax.set_xticks(np.arange(len(names)), names)
    ax.set(ylabel='validation loss', title=f"last {models[names[0]]['knockout']['window']} keys + "
                                           "first k positions")
    ax.legend()
    return fig


def head_total_figure(plt, models):
    """Figure 5: each model's total attention weight per layer and head, min-max normalised."""
    fig, axes = side_by_side(plt, models)
    for ax, name in zip(axes[0], models):
        total = np.array([layer['head_total'] for layer in models[name]['layers']])
        # min-max over the model's grid (the paper: "normalized to [0, 1]")
        span = total.max() - total.min()
        layer_by_head(fig, ax, (total - total.min()) / (span if span > 0 else 1), name, vmin=0,
                      vmax=1)
    return fig


def heatmap_figure(plt, models, layer):
    """Figure 9: each model's head-averaged attention weights of one layer, the top-left corner."""
    fig, axes = side_by_side(plt, models)
    for ax, name in zip(axes[0], models):
        image = ax.imshow(np.array(models[name]['layers'][layer - 1]['corner']))
        ax.set(title=name, xlabel='key', ylabel='query')
        fig.colorbar(image, ax=ax)
    return fig


def alpha_figure(plt, models, affine):
    """For each affine model: alpha's quantiles per layer (top) and alpha_ma per layer and head
    (bottom)."""
    fig, axes = side_by_side(plt, affine, rows=2)
    for top, bottom, name in zip(axes[0], axes[1], affine):
        layers = models[name]['layers']
        top.bxp([dict(whislo=q['p5'], q1=q['p25'], med=q['median'], q3=q['p75'], whishi=q['p95'],
                      fliers=[q['min'], q['max']]) for q in (l['alpha_quantiles'] for l in layers)],
                positions=list(layer_numbers(models)))
        top.set(title=f"{name}: alpha", xlabel='layer', ylabel='alpha')
        layer_by_head(fig, bottom, [l['alpha_ma'] for l in layers], f"{name}: alpha_ma")
    return fig


def sinks_figure(plt, models, sink):
    """For each model with learned sinks: its sink logits per layer and head."""
    fig, axes = side_by_side(plt, sink)
    for ax, name in zip(axes[0], sink):
        layer_by_head(fig, ax, [l['sinks'] for l in models[name]['layers']], f"{name}: sink "
                                                                             "logits",
                      cmap='coolwarm')
    return fig


def sink_lines(models):
    """The report's sections on the sink's measures (probes.py; docs/analysis.md defines each) and
    what it costs."""
    names = list(models)
    number = lambda v, digits=3: '-' if v is None else f"{v:.{digits}f}"
    lines = ['', "## Where each row's attention goes, per layer (mean over heads and queries i >= "
                 "1)", '',
             'weight: w_i0 (Figure 4); share: w_i0 / the row\'s sum; null: 1 - the row\'s sum (the '
             'null slot of sink and softmax1, what affine\'s scale took); first or null: their sum '
             '(Figure 9\'s reading of sink); Sink_1: Gu et al.\'s rate (heads whose first-position '
             'score exceeds 0.3; on the null slot after the /); value-weighted: the first token\'s '
             'share of ||w_ij f(x_j)|| (Kobayashi et al.); negative rows: the share of rows '
             'holding a negative weight (affine).']
    for n in names:
        slot = 'sink_rate_null_slot' in models[n]['layers'][0]
        lines += ['', f"### {n}", '', '| layer | weight | share | null | first or null | Sink_1 | '
                                      'value-weighted | negative rows '
                                      '|', '|---|---|---|---|---|---|---|---|']
        lines += [f"| {i + 1} | {l['first_token']:.4f} | {l['first_token_share']:.4f} | "
                  f"{l['null_mass']:.4f} | {l['first_or_null']:.4f} | {l['sink_rate']:.3f}"
                  + (" / " f"{l['sink_rate_null_slot']:.3f}" if slot else '')
                  + f" | {l['value_weighted_first']:.4f} | {l['negative_rows']:.3f} |"
                  for i, l in enumerate(models[n]['layers'])]
    lines += ['', '## Sink_1^0.3 (Gu et al. 2025) over the model', '',
              'The share of (layer, head) pairs whose first-position score exceeds 0.3, averaged '
              'over samples: on the analysed sequences, and in their own setting (windows of 64 '
              'tokens); "null slot": the slot of sink and softmax1 as an extra position 0 (their '
              'key-bias reading); "mean head": the measure this repository used before (heads '
              'whose mean first-token weight exceeds 0.3).', '',
              '| model | analysed | null slot | their setting | null slot | mean head '
              '|', '|---|---|---|---|---|---|']
    for n in names:
        m, gu = models[n], models[n]['gu'] or {}
        setting = f"{number(gu.get('sink_rate'))} ({gu['samples']} x {gu['length']})" if gu else '-'
        lines.append(f"| {n} | {number(m['sink_rate'])} | {number(m.get('sink_rate_null_slot'))} | "
                     f"{setting} | {number(gu.get('sink_rate_null_slot'))} | "
                     f"{number(m['sink_rate_mean_head'])} |")
    lines += notes_lines(models, 'gu')
    lines += ['', '## Activation outliers per layer (Bondarenko et al. 2023)', '',
              "max |x| per sequence averaged over sequences and kurtosis, of the attention layer's "
              "output, and max |x| of the residual stream after the layer; each with / without "
              "position 0."]
    for n in names:
        lines += ['', f"### {n}", '', '| layer | attention max abs | attention kurtosis | residual '
                                      'max abs |',
                  '|---|---|---|---|']
        lines += [f"| {i + 1} | {l['attention_max_abs']:.3g} / "
                  f"{l['attention_max_abs_after_first']:.3g} | {l['attention_kurtosis']:.3g} / "
                  f"{l['attention_kurtosis_after_first']:.3g} | {l['residual_max_abs']:.3g} / "
                  f"{l['residual_max_abs_after_first']:.3g} |"
                  for i, l in enumerate(models[n]['layers'])]
    knockout = next(iter(models.values()))['knockout']
    firsts = [key for key in knockout if key.startswith('first_')]
    lines += ['', '## What a sink costs', '',
              'W8A8: validation loss in full precision and with int8 weights (symmetric, per '
              'tensor) and int8 inputs of every linear layer but the last (asymmetric, per tensor, '
              'ranges fixed on calibration windows), and their ratio. Knockout (StreamingLLM): the '
              f"loss of the predictions of queries i >= {knockout['window']} when each sees only "
              f"its last {knockout['window']} keys and the first k positions, against full "
              'attention on the same predictions.', '',
              '| model | loss | W8A8 | ratio | calibration windows | knockout: full | ' +
              ' | '.join(f"k = {k[6:]}" for k in firsts) + ' '
                                                           '|', '|---|---|---|---|---|---|'
              + '---|' * len(firsts)]
    for n in names:
        q, k = models[n]['w8a8'] or {}, models[n]['knockout']
        lines.append(f"| {n} | {number(q.get('fp'))} | {number(q.get('w8a8'))} | "
                     f"{number(q.get('ratio'))} | {q.get('calibration', '-')} | {k['full']:.3f} "
                     "| " +
                     ' | '.join(f"{k[key]:.3f}" for key in firsts) + ' |')
    return lines + notes_lines(models, 'w8a8')


def attention_report(specs, out_dir, data='c4', num_seqs=10, seq_len=1024, seed=0, layer=None,
                     corner=30,
                     data_dir=None, tokenizer=None, device='cpu', dtype='float32', batch_size=1,
                     sink_samples=GU_SAMPLES, calibration=4, knockout_window=0):
    """The `attention` job: statistics of every checkpoint in specs on the same held-out text and
    what its sink costs (sink_costs), then figures, numbers.json and report.md in out_dir. A text
    with fewer windows than asked for is read as far as it goes (each model's `notes` say where);
    only one with no window at all is refused."""
    # offline: refused before any load
    c4 = c4_validation(data_dir, specs[0], tokenizer) if data == 'c4' else None
    settings = SimpleNamespace(num_seqs=num_seqs, seed=seed, corner=corner, batch_size=batch_size,
                               sink_samples=sink_samples, calibration=calibration,
                               knockout_window=knockout_window)
    models, shapes, sources = {}, set(), {}
    for spec in specs:
        model, enc = load_model_and_tokenizer(spec, tokenizer, torch.device(device),
                                              getattr(torch, dtype))
        cfg = model.config
        shapes.add((cfg.n_layer, cfg.n_head))
        if len(shapes) > 1:
            raise RunError(f"models of different shapes (n_layer, n_head) {sorted(shapes)}; "
                           "analyse each size separately")
        length = checked_length(spec, cfg, layer, seq_len, knockout_window)
        windows = heldout_text(data, enc, tokenizer_info(enc, spec)['sha256'], data_dir, c4)
        name = method_name(vars(cfg))
        name = name if name not in models else f"{name} ({spec})"
        models[name], sources[name] = measure_model(model, spec, name, windows, length, data,
                                                    settings)
        del model
    n_layer = shapes.pop()[0]
    layer = layer or max(1, n_layer // 2)  # the paper's Figure 9 shows layer 8 of the 1B model's 16

    def build(tmp):
        figures = attention_figures(tmp, models, layer)
        with open(os.path.join(tmp, 'numbers.json'), 'w') as f:
            json.dump(dict(data=data, num_seqs=num_seqs, seed=seed, layer=layer, corner=corner,
                           models={name: dict(sources[name], **stats) for name,
                                   stats in models.items()}), f)
        lines = attention_lines(models, sources, data, seed, n_layer) + sink_lines(models)
        lines += ['', '## Figures', ''] + [f"![{title}]({file})" for file, title in sorted(figures)]
        with open(os.path.join(tmp, 'report.md'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
        return figures

    figures = write_report(out_dir, build)
    return models, figures


def checked_length(spec, cfg, layer, seq_len, knockout_window):
    """The analysed sequences' length for a model of config cfg, once the settings are checked
    against it."""
    if layer and not 1 <= layer <= cfg.n_layer:
        raise RunError(f"--layer={layer}: the models have layers 1-{cfg.n_layer}")
    length = seq_len or min(1024, cfg.block_size)
    if length > cfg.block_size:
        raise RunError(f"{spec}: --seq_len={length} exceeds the model's block_size "
                       f"{cfg.block_size}")
    if knockout_window >= length - 1:
        raise RunError(f"--knockout_window={knockout_window} leaves no prediction of {length} "
                       f"tokens to knock out: use one below {length - 1}")
    return length


def measure_model(model, spec, name, windows, length, data, settings):
    """(statistics, source) of one model: model_statistics on settings.num_seqs windows of `length`
    tokens of the held-out text (heldout_text's windows; all of them where it has fewer, none
    refused), then sink_costs."""
    count, get, what = windows(length)
    if not count:
        raise RunError(f"{what} has no window of {length} tokens; give a longer text, or a lower "
                       "--seq_len")
    num_seqs = min(settings.num_seqs, count)
    picks = draw(count, num_seqs, settings.seed, what, length)
    # trained on windows that all start with this token: so are these
    first = window_first_token(spec)
    sequences = starting_with(first, get(picks))
    print(f"{spec}: {name}, {model.config.n_layer} layers, {num_seqs} x {length} tokens of "
          f"{data}", file=sys.stderr)
    stats = model_statistics(model, sequences, settings.corner, settings.batch_size,
                             Progress(f"{name} sequences", num_seqs))
    stats |= sink_costs(model, windows, first, sequences, np.setdiff1d(np.arange(count), picks),
                        settings.seed,
                        settings.sink_samples, settings.calibration, settings.knockout_window,
                        settings.batch_size)
    if num_seqs < settings.num_seqs:
        stats['notes'] = dict(sequences=f"analysed: {windows_of(num_seqs, length)}, fewer than "
                                        f"--num_seqs={settings.num_seqs}: {what} has no "
                                        "more", **stats['notes'])
    for note in stats['notes'].values():
        print(f"{spec}: {note}", file=sys.stderr)
    return stats, dict(spec=spec, attention=model.config.attention, seq_len=length,
                       num_seqs=num_seqs, first_token=first)


def attention_lines(models, sources, data, seed, n_layer):
    """The report's opening: the text and the models, then Figures 3, 4 and 6 and alpha or the sink
    logits as tables."""
    names = list(models)
    counts = sorted({sources[n]['num_seqs'] for n in names})
    lines = ['# Attention analysis', '',
             f"Held-out text: {' or '.join(map(str, counts))} sequence{'s' * (counts != [1])} of "
             f"{sources[names[0]]['seq_len']} tokens drawn (seed {seed}) from `{data}`. Weights "
             "are each variant's effective attention weights (sink: without the sink's mass; "
             "affine: alpha * softmax + beta on the visible keys; gated: the softmax, the gate "
             "(per channel, or per head) acts after). Entropy is that of |w| normalised over the "
             "visible keys (affine weights can be negative).", '', '| model | checkpoint |',
             '|---|---|']
    lines += [f"| {n} | `{sources[n]['spec']}` |" for n in names]
    lines += notes_lines(models, 'sequences')
    lines += ['', '## Per-query attention weight sums (Figure 3)', '', '| model | mean | median '
                                                                       '|', '|---|---|---|']
    lines += [f"| {n} | {models[n]['row_sums']['mean']:.4f} | "
              f"{models[n]['row_sums']['median']:.4f} |" for n in names]
    for key, title in [('first_token', 'First-token attention weight per layer (Figure 4)'),
                       ('entropy', 'Mean attention entropy per layer (Figure 6)')]:
        lines += ['', f"## {title}", '', '| layer | ' + ' | '.join(names) + ' '
                                                                            '|', '|---|'
                  + '---|' * len(names)]
        lines += [f"| {i + 1} | " + ' '
                                    '| '.join(f"{models[n]['layers'][i][key]:.4f}" for n in names)
                  + ' |' for i in range(n_layer)]
    for n in names:
        layers = models[n]['layers']
        if 'alpha_ma' in layers[0]:
            lines += ['', f"## {n}: alpha and alpha_ma per layer (mean over heads)", '',
                      'alpha\'s standard deviation is across queries, per head, averaged over '
                      'heads (0: a scale that ignores its input); "at 0", "at 1": the shares of '
                      'alphas clipped there by Eq. 11.', '',
                      '| layer | alpha mean | std | p5-p95 | at 0 | at 1 | alpha_ma |',
                      '|---|---|---|---|---|---|---|']
            lines += [f"| {i + 1} | {l['alpha_mean']:.4f} | {l['alpha_std']:.4f} | "
                      f"{l['alpha_quantiles']['p5']:.3f}-{l['alpha_quantiles']['p95']:.3f} | "
                      f"{l['alpha_at_0']:.3f} | {l['alpha_at_1']:.3f} | "
                      f"{np.mean(l['alpha_ma']):.4f} |"
                      for i, l in enumerate(layers)]
        if 'sinks' in layers[0]:
            lines += ['', f"## {n}: sink logits per layer (mean, min, max over heads)", '',
                      '| layer | mean | min | max |', '|---|---|---|---|']
            lines += [f"| {i + 1} | {np.mean(l['sinks']):.3f} | {min(l['sinks']):.3f} | "
                      f"{max(l['sinks']):.3f} |"
                      for i, l in enumerate(layers)]
    return lines


def notes_lines(models, key):
    """The report's lines for what the text did not allow of one measure (sink_costs' and
    measure_model's notes)."""
    notes = [f"- {name}: "
             f"{stats['notes'][key]}" for name, stats in models.items() if key in stats['notes']]
    return ['', 'What the held-out text allowed:', '', *notes] if notes else []

# -----------------------------------------------------------------------------
# From training runs: Figures 2, 7, 8, 10 and Tables 4-5


def label_runs(runs):
    """Each run's label: its method, with the seed (or the directory) where several runs share a
    method, and the objective where the runs were trained to different ones (their losses are then
    different quantities)."""
    mixed = len({r['objective'] for r in runs}) > 1
    names = [r['method'] + (f" [{r['objective']}]" if mixed else '') for r in runs]
    for r, name in zip(runs, names):
        r['label'] = name
        if names.count(name) > 1:
            seeds = [seed_of(s) for s, other in zip(runs, names) if other == name]
            seed = seed_of(r)
            r['label'] += (f" seed {seed}" if seed is not None and seeds.count(seed) == 1
                           else f" ({r['dir']})")
    return runs


def check_one_size(runs):
    shapes = {(r['config'].n_layer, r['config'].n_embd) if r['config'] else None for r in runs}
    if len(shapes) > 1:
        raise RunError(f"runs of different model sizes (n_layer, n_embd) {sorted(shapes, key=str)} "
                       "in one report; analyse each size separately")


def loss_key(runs):
    """The paper's training loss is the KD loss (Figure 7); runs without a teacher have only the
    loss."""
    return 'kd_loss' if all('kd_loss' in r['records'][0] for r in runs) else 'loss'


def plot(path, runs, y_key, title, ylabel, first_step=0, logy=False):
    """One figure: y_key over steps for every run that logged it, overlaid."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        points = [(r['step'], r[y_key]) for r in run['records'] if y_key in r
                  and r['step'] > first_step]
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
    """The `runs` job: Figures 2, 7, 8, 10 and Tables 4-5 for runs of one model size."""
    runs = label_runs([load_run(d) for d in run_dirs])
    check_one_size(runs)
    numbers, key = {}, loss_key(runs)
    for run in runs:
        g = [r['grad_norm'] for r in run['records']]
        try:
            stats, spikes = grad_norm_statistics(g, *window), spike_counts(g, ks, *window)
        except ValueError as e:  # a run shorter than Tables 4-5's window: say how to pick another
            raise RunError(f"{run['dir']}: {e}; give a window within it, e.g. "
                           f"--window=0,{len(g)}") from None
        numbers[run['dir']] = dict(label=run['label'], steps=len(g),
                                   final_loss=run['records'][-1][key],
                                   grad_norm=stats, spikes={str(k): n for k, n in spikes.items()})
    last = max(len(r['records']) for r in runs)
    figures = [('fig7_loss.png', key, f"Figure 7: {key.replace('_', ' ')}", key, 0, True),
               ('fig10_loss_late.png', key, f"Figure 10: {key.replace('_', ' ')}, last {late} "
                                            "steps",
                key, max(0, last - late), False),
               ('fig8_grad_norm.png', 'grad_norm', 'Figure 8: gradient norm (before clipping)',
                'grad norm', 0, True),
               ('fig2_attn_logit.png', 'attn_logit_mean',
                'Figure 2: mean attention logit q.k/sqrt(d)', 'mean logit', 0, False)]
    lo, hi = window
    run_list = ', '.join(f"`{d}` ({n['label']})" for d, n in numbers.items())
    lines = ['# Training runs', '', f"Runs: {run_list}.", '',
             f"## Table 4: gradient-norm statistics, steps {lo}-{hi} (raw norms, before "
             "clipping)", '',
             '| run | mean | std | variance | CV |', '|---|---|---|---|---|']
    lines += [f"| {n['label']} | {n['grad_norm']['mean']:.3f} | {n['grad_norm']['std']:.3f} | "
              f"{n['grad_norm']['variance']:.3f} | {n['grad_norm']['cv']:.2f} "
              "|" for n in numbers.values()]
    lines += ['', f"## Table 5: gradient-norm spikes, steps {lo}-{hi} (g > median + k MAD)", '',
              '| run | ' + ' | '.join(f'k={k}' for k in ks) + ' |', '|---|' + '---|' * len(ks)]
    lines += [f"| {n['label']} | " + ' | '.join(str(n['spikes'][str(k)]) for k in ks) + ' '
                                                                                        '|'
              for n in numbers.values()]
    lines += ['', '## Figures', ''] + [f"![{title}]({name})" for name, _, title, *_ in figures]

    def build(tmp):
        for name, y, title, ylabel, first, logy in figures:
            plot(os.path.join(tmp, name), runs, y, title, ylabel, first, logy)
        with open(os.path.join(tmp, 'numbers.json'), 'w') as f:
            json.dump(dict(window=list(window), ks=list(ks), runs=numbers), f, indent=1)
        with open(os.path.join(tmp, 'report.md'), 'w') as f:
            f.write('\n'.join(lines) + '\n')

    write_report(out_dir, build)
    return numbers

# -----------------------------------------------------------------------------
# Tables 1-3: method, ΔParams, loss, perplexity, zero-shot accuracies


ACCURACY_COLUMNS = [('winogrande', 'Wino'), ('piqa', 'PIQA'), ('hellaswag', 'Hella'),
                    ('arc_challenge', 'ARC-c'),
                    # the paper's order
                    ('arc_easy', 'ARC-e'), ('boolq', 'BoolQ'), ('heldout', 'Held-out')]


def seed_of(run):
    """A load_run run's seed, None where it has no config.json."""
    return run['config'].seed if run['config'] else None


def attention_params(config):
    """(total parameters, ΔParams) of a RunConfig: ΔParams = what the variant adds to the same model
    with softmax attention, counted on the meta device (no memory, no checkpoint needed)."""
    with torch.device('meta'):
        model = GPT(ModelConfig(**{k: getattr(config, k) for k in FIELD_NAMES}))
    return model.get_num_params(), model.get_num_params(variant_only=True)


def count(n):
    """A parameter count as the paper prints it (millions, one decimal), exact below 0.1M (tiny
    models)."""
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def data_identity(run):
    """What identifies the data a run trained on: its checkpoint's fingerprint of it (the
    tokenizer's sha256 and each split's size: what a resume checks, so data_dir may have moved),
    else the data_dir its config names."""
    path = os.path.join(run['dir'], CKPT_NAME)
    if os.path.isfile(path):
        return json.dumps(read_checkpoint(path, keys=('data',))['data'], sort_keys=True)
    return run['config'].data_dir if run['config'] else None


def method_rows(rows, columns):
    """(numbers, markdown lines) of one comparable table: per method (several seeds: mean ± sample
    std) ΔParams and the columns, the best mean per column in bold."""
    numbers = {}
    for method, group in rows.items():
        total, extra = attention_params(group[0]['config'])
        numbers[method] = dict(params=total, delta_params=extra, runs=[r['dir'] for r in group],
                               seeds=[seed_of(r) for r in group],
                               columns={name: mean_std([get(r) for r in group]) for name, get, _,
                                        _ in columns})
    lines = ['| Method | ΔParams | ' + ' | '.join(name for name, *_ in columns) + ' |',
             '|---|---|' + '---|' * len(columns)]
    cells = {m: {} for m in numbers}
    for name, _, best, digits in columns:
        shown = {m: f"{n['columns'][name][0]:.{digits}f}" for m, n in numbers.items()}
        top = best(float(v) for v in shown.values())
        for m, n in numbers.items():
            mean, std = n['columns'][name]
            text = f"**{shown[m]}**" if float(shown[m]) == top and len(numbers) > 1 else shown[m]
            cells[m][name] = text + (f" ± {std:.{digits}f}" if std is not None else '')
    lines += [f"| {m} | {count(n['delta_params'])} | " + ' '
                                                         '| '.join(cells[m][name] for name,
                                                                   *_ in columns) + ' |'
              for m, n in numbers.items()]
    return numbers, lines


def perplexity_column(runs, eval_file):
    """(the perplexity column's name, a run's value): C4's where every run's eval file holds it,
    else each run's last val_ppl; a RunError that names each run without one (it named none)."""
    if all('c4' in r['eval'] for r in runs):
        return 'C4 PPL', lambda r: r['eval']['c4']['ppl']
    lacking = [r['dir'] for r in runs if not any('val_ppl' in x for x in r['records'])]
    if lacking:
        raise RunError(f"{', '.join(lacking)}: no val_ppl in metrics.jsonl (the run never reached "
                       "an evaluation); the perplexity column takes every run's last val_ppl, or "
                       f"c4 where every run's {eval_file} holds it: train the run to an evaluation "
                       "(every eval_interval steps, and at its last), or evaluate c4 for every run "
                       "(eval_zeroshot.py --tasks=...,c4)")
    return 'Val PPL', lambda r: [x['val_ppl'] for x in r['records'] if 'val_ppl' in x][-1]


def table_report(run_dirs, out_dir, eval_file='eval.json', metric='acc_norm'):
    """The `table` job: Tables 1-3 for runs of one model size, one table per training objective and
    data set (rows of different ones are not comparable, and are never pooled or ranked together).
    Columns: ΔParams, the final training loss (the KD loss of runs distilled from a teacher, Figure
    7's; the cross-entropy of runs without), perplexity (C4 where evaluated, else the run's last
    val_ppl), the accuracies of each task every run was evaluated on (x 100; `metric` = acc_norm
    where the task reports it, else acc — the paper does not say which it quotes) and their average.
    Runs of one method (several seeds) are one row, mean ± sample std; the best mean per column of a
    table is bold (lowest loss and perplexity, highest accuracy)."""
    runs = [load_run(d) for d in run_dirs]
    check_one_size(runs)
    for run in runs:
        path = os.path.join(run['dir'], eval_file)
        if not os.path.isfile(path):
            raise RunError(f"{run['dir']}: no {eval_file}; run eval_zeroshot.py "
                           f"--ckpt={run['dir']} --out={path}")
        with open(path) as f:
            run['eval'] = json.load(f)
        if not run['config']:
            raise RunError(f"{run['dir']}: no config.json (needed for ΔParams)")
        run['data'] = data_identity(run)
    tasks = [(t, name) for t, name in ACCURACY_COLUMNS if all(t in r['eval'] for r in runs)]
    ppl = perplexity_column(runs, eval_file)

    def accuracy(r, task):
        result = r['eval'][task]
        return 100 * (result['acc_norm'] if metric == 'acc_norm'
                      and result.get('acc_norm') is not None else result['acc'])

    tables = {}  # (objective, data) -> {method: runs}
    for run in runs:
        tables.setdefault((run['objective'], run['data']), {}).setdefault(run['method'],
                                                                          []).append(run)
    groups, report, lines = [], ['# Results table', ''], []
    for (goal, _), rows in tables.items():
        key, loss = ('loss', 'CE loss') if goal == 'CE' else ('kd_loss', 'KD loss')
        columns = [(loss, lambda r, key=key: r['records'][-1][key], min, 3),
                   (ppl[0], ppl[1], min, 2)]
        columns += [(name, lambda r, t=t: accuracy(r, t), max, 1) for t, name in tasks]
        if tasks:
            columns.append(('Avg.', lambda r: statistics.fmean(accuracy(r, t) for t, _ in tasks),
                            max, 1))
        numbers, table = method_rows(rows, columns)
        data_dir = next(iter(rows.values()))[0]['config'].data_dir
        groups.append(dict(objective=goal, data_dir=data_dir, loss=key, methods=numbers))
        title = f"{goal}, data {data_dir}"
        if all(len(group) > 1 for group in rows.values()) and len(rows) > 1:
            note = noise_note(numbers, columns)
        else:
            note = ("One run per method: there is no estimate of run-to-run noise, so small "
                    "differences between rows are not evidence that one method is better (run "
                    "several seeds).")
        report += [f"## {title}", '', *table, '', note, '']
        lines += [f"{title}:", *table]
    first = groups[0]['methods'][next(iter(groups[0]['methods']))]
    first_run = runs[0]
    seeds = sorted({s for g in groups for n in g['methods'].values() for s in n['seeds']}, key=str)
    report.append(f"Model: {first_run['config'].n_layer} layers, width "
                  f"{first_run['config'].n_embd}, "
                  f"{(first['params'] - first['delta_params']) / 1e6:,.1f}M parameters with "
                  "softmax attention. Each table holds runs of one training objective and one data "
                  "set; only its rows are compared. Loss: the final step's KD loss (runs distilled "
                  "from a teacher) or CE loss (cross-entropy, runs without). Accuracies x 100 "
                  f"({metric} where the task reports it, else acc). Seeds: "
                  f"{', '.join(map(str, seeds))}.")

    def build(tmp):
        with open(os.path.join(tmp, 'numbers.json'), 'w') as f:
            json.dump(dict(metric=metric, tables=groups), f, indent=1)
        with open(os.path.join(tmp, 'report.md'), 'w') as f:
            f.write('\n'.join(report) + '\n')

    write_report(out_dir, build)
    return groups, lines


def noise_note(numbers, columns):
    """Which columns separate the best method from the rest by more than noise: a difference counts
    only when it exceeds two standard errors of the difference of two means, 2 sqrt(s_a^2 / n_a +
    s_b^2 / n_b)."""
    within = []
    for name, _, best, _ in columns:
        means = {m: n['columns'][name][0] for m, n in numbers.items()}
        top = best(means, key=means.get)
        for m, n in numbers.items():
            (a, sa), (b, sb) = numbers[top]['columns'][name], n['columns'][name]
            if m != top and abs(a - b) <= 2 * math.sqrt(sa ** 2 / len(numbers[top]['runs'])
                                                        + sb ** 2 / len(n['runs'])):
                within.append(f"{name}: {top} vs {m}")
    if not within:
        return ("Every column's best method is ahead of every other by more than two standard "
                "errors.")
    return ("Within noise (the difference to the column's best is at most two standard errors of "
            "the difference): "
            + '; '.join(within) + '.')


# The three jobs: (their keys, the name of their positional list, what they do, the rules between
# their keys)
JOBS = dict(
    attention=(dict(
        out_dir=Key(None, types=(str,), required=True),
        data=Key('c4', "held-out text: c4 (Appendix A.1; from the hub, or --data_dir), a "
                       "prepare_data.py directory (its val split) or a UTF-8 text file"),
        data_dir=Key(None, "c4 offline: a directory of eval_zeroshot.py "
                           "--export_data", types=(str,)),
        num_seqs=Key(10, "sequences (Appendix A.1: 10; all of the text's windows where it has "
                         "fewer)", min=1),
        seq_len=Key(0, "tokens per sequence (0: min(1024, block_size))", min=0),
        seed=Key(0, "which windows are drawn", min=0),
        layer=Key(0, "Figure 9's layer, 1-based (0: n_layer // 2)", min=0),
        corner=Key(30, "Figure 9's block size", min=1),
        tokenizer=Key(None, "where a checkpoint's tokenizer is now, if it moved", types=(str,)),
        device=DEVICE,
        dtype=Key('float32', choices=('float32', 'bfloat16', 'float64')),
        batch_size=Key(1, "sequences per forward", min=1),
        sink_samples=Key(GU_SAMPLES, f"windows of {GU_LENGTH} tokens for Gu et al.'s Sink_1 (0: "
                                     "skip)", min=0),
        calibration=Key(4, "W8A8's calibration windows, apart from the analysed (0: no "
                           "W8A8)", min=0),
        knockout_window=Key(0, "the first-token knockout's recent window W (0: a quarter of "
                               "--seq_len)", min=0),
    ), 'checkpoints', "Figures 3-6, 9, alpha and sinks, the sink's measures and costs from "
                      "checkpoints (train.py out_dirs, ckpt.pt files or HF model directories) on "
                      "held-out text", ()),
    runs=(dict(
        out_dir=Key(None, types=(str,), required=True),
        window=Key([0, 500], "steps for Tables 4-5: start,end (the paper: 0,500)", min=0),
        ks=Key([6.0, 9.0], "spike thresholds k in median + k MAD (the paper: 6,9)", above=0),
        late=Key(2000, "steps in Figure 10's late-phase zoom", min=1),
    ), 'run_dirs', "Figures 2, 7, 8, 10 and Tables 4-5 from the metrics.jsonl of train.py out_dirs "
                   "of one model size",
        ('len(window) == 2 and window[0] < window[1]',)),
    table=(dict(
        out_dir=Key(None, types=(str,), required=True),
        eval_file=Key('eval.json', "eval_zeroshot.py --out file inside each run dir"),
        metric=Key('acc_norm', "acc_norm: where a task reports it (ARC, HellaSwag, PIQA), else acc",
                   choices=('acc_norm', 'acc')),
    ), 'run_dirs', "Tables 1-3 from runs (train.py out_dirs of one model size, several seeds "
                   "allowed) and their eval_zeroshot results", ()),
)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    jobs = '\n'.join(f"  python analyze.py {job} {positional} ... --out_dir=DIR   {what}"
                     for job, (_, positional, what, _) in JOBS.items())
    if not argv or argv[0] not in JOBS:
        if argv and argv[0] in ('-h', '--help'):
            print(f"The paper's analyses and tables; see the docstring of analyze.py.\n\n{jobs}")
            raise SystemExit(0)
        fail(f"the first argument is the job, one of {', '.join(JOBS)}; got "
             f"{argv[0] if argv else 'none'}",
             f"usage:\n{jobs}\n")
    keys, positional, what, rules = JOBS[argv[0]]
    args = SimpleNamespace(job=argv[0], **parse(argv[1:], keys, what, positional, prog='analyze.py '
                                                                                       f'{argv[0]}',
                                                rules=rules))
    claim_dir(args.out_dir, 'analyze.py', ours=is_report, writes=('report.md', 'numbers.json'))
    check_writable(args.out_dir)  # before the analyses: a report that cannot be written is lost
    if args.job == 'attention':
        models, figures = attention_report(args.checkpoints, args.out_dir, args.data, args.num_seqs,
                                           args.seq_len,
                                           args.seed, args.layer, args.corner, args.data_dir,
                                           args.tokenizer,
                                           str(resolve_device(args.device)), args.dtype,
                                           args.batch_size,
                                           args.sink_samples, args.calibration,
                                           args.knockout_window)
        print(f"wrote {args.out_dir}/report.md, numbers.json and {len(figures)} figures for "
              f"{len(models)} models")
    elif args.job == 'runs':
        numbers = runs_report(args.run_dirs, args.out_dir, tuple(args.window),
                              tuple(int(k) if k.is_integer() else k for k in args.ks), args.late)
        print(f"wrote {args.out_dir}/report.md, numbers.json and 4 figures for {len(numbers)} runs")
    else:
        tables, lines = table_report(args.run_dirs, args.out_dir, args.eval_file, args.metric)
        print('\n'.join(lines))
        print(f"wrote {args.out_dir}/report.md and numbers.json: {len(tables)} table(s), "
              f"{sum(len(t['methods']) for t in tables)} row(s)")


if __name__ == '__main__':
    run_script(main)
