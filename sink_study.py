"""
The sink study: does softmax attention, trained by this repo, put a first-token sink into a model, and how does each
attention variant compare? The paper's central picture (Figure 4: the first token's attention weight per layer,
affine < sink < softmax) at a scale two CPU cores can train, with seeds, measured as the paper measures it.

    python sink_study.py                          # every variant: CE seeds 0,1 and KD seed 0 -> out/sink_study/report.md
    python sink_study.py --device=cuda --jobs=1   # the same on one GPU, through the same code (minutes)
    python sink_study.py --variants=softmax,affine --seeds=0 --arms=ce --tokens=2000000 --learning_rate=1e-3

The recipe (config/sink_study.py; docs/analysis.md tells how it was found): the quick start's tiny shape on 128-token
windows of Python's standard library (prepare_data.py --source=stdlib, byte tokens) that all begin with the same token,
<|endoftext|> (train.py's first_token='prefix'), trained with a large learning rate and weight decay: the setting in
which Gu et al. (ICLR 2025, arXiv 2410.10781) find that softmax grows a sink. Every variant gets the same recipe, the
same data, tokens and seeds; none is tuned on its own. Any train.py key given here (--learning_rate=..., --block_size=,
...) changes the recipe of every run alike.

Arms: ce, each variant trained from scratch with cross-entropy, once per --seeds; kd, each variant distilled (pure KD,
as the paper) from the ce arm's softmax run of seed 0, once per --kd_seeds: a teacher with a sink, students with
each attention. Each run is one train.py run in out_dir/runs/<arm>_<variant>_s<seed> (its metrics.jsonl and ckpt.pt,
which every tool of the repo reads), --jobs at a time, each with cores / jobs threads. Its evaluations, every
--tokens / 8 tokens, measure the attention on fixed validation windows (train.py's attention_windows): per layer, the
first token's weight (raw, and as a share of each row's total), the learned sink's mass, per-head values, Sink_1^0.3
(the share of heads whose mean first-token weight exceeds 0.3), entropy and row sums; and the validation loss. The
study then writes out_dir/results.json (docs/analysis.md documents it), report.md and its figures.

A re-run skips finished runs and continues interrupted ones from their checkpoints (train.py's init_from=auto); a run
whose recipe changed is trained again from scratch. Progress and an ETA go to the console.
"""
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

from configurator import Key, parse
from files import RunError, atomic_write, claim_dir, run_script, write_json
from model import ATTENTIONS, PAPER_VARIANTS
from probes import (SINK_STUDY_EVALUATIONS as EVALUATIONS, SINK_THRESHOLD, first_token_share, first_token_weight,
                    layer_mean)

SOFTMAX, SINK, GATED, AFFINE, AFFINE_GATED = PAPER_VARIANTS  # the paper's five, in its order
TEACHER = f'ce_{SOFTMAX}_s0'  # the kd arm's teacher: the ce arm's softmax run of seed 0

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = 'config/sink_study.py'
SCHEMA_VERSION = 1
SPIKE_KS = (6, 9)  # Table 5's thresholds: median + k MAD
# a real pretrained softmax model's first-token weight, for scale: as the quick start's real-model stage measured it
SMOLLM2 = dict(first_token_mean=0.36, first_token_max=0.65, source=(
    "python quickstart.py's real-model stage: SmolLM2-135M-Instruct (analyze.py attention on the built-in corpus in "
    "its tokens, 4 x 256 tokens; docs/analysis.md)"))


def study_keys(variants):
    return dict(
        out_dir=Key('out/sink_study', "where runs/, results.json, report.md and the figures go"),
        data_dir=Key('data/stdlib_bytes', "the prepared corpus (made here first if missing: prepare_data.py "
                     "--source=stdlib --tokenizer=bytes)"),
        variants=Key(list(variants), "comma-separated attention variants (model.py's registry)", choices=variants),
        seeds=Key([0, 1], "the ce arm's seeds", min=0),
        kd_seeds=Key([0], "the kd arm's seeds", min=0),
        arms=Key(['ce', 'kd'], "ce: cross-entropy from scratch; kd: distilled from the ce arm's softmax seed 0",
                 choices=('ce', 'kd')),
        tokens=Key(3_000_000, "training tokens per run", min=1),
        device=Key('cpu', "cpu, cuda, cuda:1, ... (every run on it)"),
        jobs=Key(0, "runs at once (0: one per CPU core on cpu, 1 on a GPU)", min=0),
        report_only=Key(False, "write results.json and report.md from the runs there are, train nothing"),
    )


# -----------------------------------------------------------------------------
# The plan: which train.py runs, with which arguments

def split_argv(argv, own):
    """(the study's own arguments, train.py overrides): any --key=value whose key is not the study's goes to every
    run's train.py (checked there, before any run starts)."""
    mine, theirs = [], []
    for arg in argv:
        name = arg[2:].partition('=')[0] if arg.startswith('--') else None
        (theirs if name and name not in own and arg not in ('--help',) else mine).append(arg)
    return mine, theirs


def plan_runs(args, overrides):
    """[(name, arm, variant, seed, train.py argv)], teachers first: the kd arm reads the ce arm's softmax seed 0."""
    import train
    base = train.load_config([os.path.join(HERE, CONFIG), *overrides])
    per_step = base['global_batch_size'] * base['block_size']
    steps = max(1, round(args.tokens / per_step))
    common = [CONFIG, f'--data_dir={args.data_dir}', f'--device={args.device}', f'--max_iters={steps}',
              f'--eval_interval={max(1, steps // EVALUATIONS)}', *overrides]
    teacher = os.path.join(args.out_dir, 'runs', TEACHER)
    runs = []
    for arm, seeds in (('ce', args.seeds), ('kd', args.kd_seeds)):
        if arm not in args.arms:
            continue
        for seed in seeds:
            for variant in args.variants:
                name = f'{arm}_{variant}_s{seed}'
                argv = [*common, f'--attention={variant}', f'--seed={seed}',
                        f"--out_dir={os.path.join(args.out_dir, 'runs', name)}"]
                runs.append(dict(name=name, arm=arm, variant=variant, seed=seed,
                                 argv=argv + ([f'--teacher={teacher}'] if arm == 'kd' else [])))
    if 'kd' in args.arms and args.kd_seeds and not any(r['name'] == TEACHER for r in runs):
        if not os.path.isfile(os.path.join(HERE, teacher, 'ckpt.pt')):
            raise RunError(f"--arms=kd distils from the ce arm's softmax run of seed 0 ({teacher}), which is neither "
                           f"there nor planned: add ce to --arms, softmax to --variants and 0 to --seeds")
    for run in runs:  # every run's settings checked before any work (train.py's own messages)
        run['config'] = train.load_config([os.path.join(HERE, run['argv'][0]), *run['argv'][1:]])
    return runs, steps, per_step


def state(run):
    """done / partial / new / changed of a run, from its checkpoint (train.planned_run: train.py's rule, which the
    quick start applies too): the same settings continue, changed ones train again from scratch."""
    import resume
    import train
    c, step, changed = train.planned_run([os.path.join(HERE, run['argv'][0]), *run['argv'][1:]], cwd=HERE)
    run['extra'], run['note'] = (resume.RESTART, resume.restart_note(c['out_dir'], changed)) if changed else ([], '')
    return 'new' if step is None else 'changed' if changed else 'done' if step >= c['max_iters'] else 'partial'


# -----------------------------------------------------------------------------
# Running: --jobs train.py processes at once, progress and an ETA on the console


def last_step(out_dir):
    """The last step metrics.jsonl records (0 without one)."""
    path = os.path.join(HERE, out_dir, 'metrics.jsonl')
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = f.read().splitlines()
        for line in reversed(lines):
            try:
                return json.loads(line)['step']
            except (ValueError, KeyError):
                continue
    except OSError:
        pass
    return 0


def run_all(runs, steps, jobs, threads, logs):
    """Train every run not done, `jobs` at a time (a kd run only once its teacher is done), printing progress."""
    todo = [r for r in runs if r['state'] != 'done']
    done_names = {r['name'] for r in runs if r['state'] == 'done'}
    running, t0, last_print = {}, time.time(), 0
    start_steps = {r['name']: last_step(r['config']['out_dir']) for r in todo}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    while todo or running:
        for name, (proc, run, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                del running[name]
                if proc.returncode != 0:
                    for p, _, _ in running.values():
                        p.terminate()
                    raise RunError(f"run {name} failed (exit code {proc.returncode}): see {logs}/{name}.log; fix it "
                                   f"and run the same command again (finished runs are skipped)")
                done_names.add(name)
                print(f"finished {name} ({len(done_names)}/{len(runs)} runs)", flush=True)
        ready = [r for r in todo if r['arm'] == 'ce' or TEACHER in done_names]
        while ready and len(running) < jobs:
            run = ready.pop(0)
            todo.remove(run)
            command = [sys.executable, 'train.py', *run['argv'], *run['extra']]
            if run['note']:
                print(run['note'], flush=True)
            print(f"$ {shlex.join(command)}  > {logs}/{run['name']}.log", flush=True)
            log = open(os.path.join(logs, f"{run['name']}.log"), 'a')
            running[run['name']] = (subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT),
                                    run, log)
        if not running and todo:
            raise RunError(f"the kd runs wait for {TEACHER}, which is not planned")
        if time.time() - last_print >= 30 or not running:
            last_print = time.time()
            progress(runs, running, todo, steps, start_steps, t0)
        time.sleep(1)


def progress(runs, running, todo, steps, start_steps, t0):
    """One console line: runs finished, each running run's step, and an ETA from the steps done since the start."""
    now = {r['name']: last_step(r['config']['out_dir']) for r in runs}
    left = sum(steps - now[r['name']] for r in runs)
    done_here = sum(now[n] - s for n, s in start_steps.items())
    elapsed = time.time() - t0
    eta = f"ETA {minutes(left * elapsed / done_here)}" if done_here > 0 and left else "ETA -"
    parts = ', '.join(f"{name} {now[name]}/{steps}" for name in running)
    finished = sum(now[r['name']] >= steps for r in runs)
    print(f"[{minutes(elapsed)}] {finished}/{len(runs)} runs done | {parts or 'none running'} | {eta}", flush=True)


def minutes(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
        f"{int(seconds // 60)}m{int(seconds % 60):02d}s"

# -----------------------------------------------------------------------------
# Results: every run's measurements, from its metrics.jsonl


def uniform_first_token(context):
    """The first token's weight under uniform causal attention, averaged over the queries after it: query i (0-based)
    spreads 1 / (i + 1) over i + 1 keys."""
    return sum(1 / (i + 1) for i in range(1, context)) / (context - 1)


def run_result(run, steps, per_step):
    """One entry of results.json's runs: the last evaluation's attention statistics and validation loss, the
    curve of every evaluation, and the gradient-norm spikes (Table 5's rule over all steps)."""
    from analyze import load_run, spike_counts
    loaded = load_run(os.path.join(HERE, run['config']['out_dir']))
    records = loaded['records']
    evals = [r for r in records if 'first_token_weight' in r]
    if not evals or records[-1]['step'] < steps:
        raise RunError(f"{run['config']['out_dir']}: the run has not finished ({records[-1]['step']} of {steps} steps); "
                       f"run the same command again to finish it")
    last = evals[-1]
    g = [r['grad_norm'] for r in records]
    return dict(
        variant=run['variant'], seed=run['seed'], arm=run['arm'], tokens=last['step'] * per_step,
        seconds=round(sum(r['dt'] for r in records), 1), val_loss=last['val_loss'],
        first_token_weight=last['first_token_weight'], first_token_share=last['first_token_share'],
        sink_mass=last.get('sink_mass'), per_head=last['first_token_per_head'], sink_rate=last['sink_rate'],
        entropy=last['entropy'], row_sum=last['row_sum'],
        spikes={str(k): n for k, n in spike_counts(g, SPIKE_KS, 0, len(g)).items()},
        curve=[dict(tokens=r['step'] * per_step, first_token_weight=r['first_token_weight'], sink_rate=r['sink_rate'],
                    val_loss=r['val_loss']) for r in evals],
        ckpt=os.path.join(run['config']['out_dir'], 'ckpt.pt'))


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def groups(results):
    """{(arm, variant): [runs]} in the plan's order: CE and KD never pooled."""
    out = {}
    for r in results['runs']:
        out.setdefault((r['arm'], r['variant']), []).append(r)
    return out


def compare(a, b, key):
    """('<', '>', '=' or '~', mean of a, mean of b): the two groups' means of key (a number per run) compared, '~'
    (within noise) where they differ by at most two standard errors of that difference; with one run in a group there
    is no noise estimate, so '~' is never said."""
    (ma, sa), (mb, sb) = mean_std([key(r) for r in a]), mean_std([key(r) for r in b])
    if ma == mb:
        return '=', ma, mb
    if sa is not None and sb is not None and abs(ma - mb) <= 2 * math.sqrt(sa ** 2 / len(a) + sb ** 2 / len(b)):
        return '~', ma, mb
    return ('<' if ma < mb else '>'), ma, mb


# The paper's five models, in its order (model.py's names for them), and its claims about them, each as (what it
# says, the variants' order it predicts, the measure, why that measure)
CLAIMS = [
    ("first-token weight affine < sink < softmax (Figure 4)", [(AFFINE, SINK), (SINK, SOFTMAX)], first_token_weight,
     "the raw weight, averaged over layers: Figure 4's own measure"),
    ("the same, as a share of each row's total", [(AFFINE, SINK), (SINK, SOFTMAX)], first_token_share,
     "affine's rows do not sum to one (Figure 3), so its raw weight is also smaller where its rows are; the share "
     "compares where each row puts its weight"),
    ("gated attention reduces the first-token weight (Table 2's gate)", [(GATED, SOFTMAX)], first_token_weight,
     "the raw weight, as Figure 4"),
    ("affine attention has a higher entropy than softmax (Figure 6)", [(SOFTMAX, AFFINE)],
     lambda r: layer_mean(r['entropy']), "analyze.py's entropy of attention magnitude, averaged over layers"),
    ("affine attention reaches a lower loss than softmax (Table 1)", [(AFFINE, SOFTMAX)], lambda r: r['val_loss'],
     "the validation loss of the last evaluation"),
    ("affine attention has fewer gradient-norm spikes than softmax (Table 5, k = 6)", [(AFFINE, SOFTMAX)],
     lambda r: r['spikes']['6'], "steps with a gradient norm above median + 6 MAD, over the whole run"),
    ("the same at k = 9", [(AFFINE, SOFTMAX)], lambda r: r['spikes']['9'], "median + 9 MAD"),
]


def verdicts(results):
    """Per arm, one line per claim: the numbers (mean ± std over seeds) and what they say."""
    by = groups(results)
    lines = []
    for arm in results['arms']:
        lines += ['', f"**{arm.upper()} arm** ({'cross-entropy from scratch' if arm == 'ce' else 'distilled from the CE softmax run of seed 0'}):", '']
        for text, pairs, key, why in CLAIMS:
            if not all((arm, v) in by for pair in pairs for v in pair):
                lines.append(f"- {text}: not measured (the study ran without {', '.join(sorted({v for p in pairs for v in p if (arm, v) not in by}))}).")
                continue
            parts, holds = [], []
            for low, high in pairs:
                sign, a, b = compare(by[arm, low], by[arm, high], key)
                holds.append(sign)
                shown = {'<': '<', '>': '>', '=': '=', '~': 'vs'}[sign]
                parts.append(f"{low} {a:.4g} {shown} {high} {b:.4g}" + (' (within noise)' if sign == '~' else ''))
            verdict = ('holds' if all(s == '<' for s in holds) else
                       'does not hold' if all(s in '>=' for s in holds) else
                       'within noise' if all(s == '~' for s in holds) else 'holds in part')
            seeds = min(len(by[arm, v]) for pair in pairs for v in pair)
            caveat = ' (one seed: no estimate of the noise, so this is not evidence either way)' if seeds < 2 else ''
            lines.append(f"- {text}: **{verdict}**{caveat} — {'; '.join(parts)}. Measure: {why}.")
    return lines


def sink_onset(run):
    """The tokens at the first evaluation where Sink_1^0.3 > 0, or None."""
    return next((p['tokens'] for p in run['curve'] if p['sink_rate'] > 0), None)


def fmt(ms, digits=3):
    mean, std = ms
    if mean is None:
        return '—'
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else '')


def figures(results, out_dir):
    """fig4_<arm>.png: per-layer first-token weight (raw, and as a share), mean ± std over seeds, per variant;
    curves_<arm>.png: the first-token weight (mean over layers) and Sink_1^0.3 against training tokens."""
    from analyze import pyplot
    plt = pyplot()
    names = []
    for arm in results['arms']:
        by = {v: runs for (a, v), runs in groups(results).items() if a == arm}
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, title in ((axes[0], 'first_token_weight', 'weight on the first token (raw)'),
                               (axes[1], 'first_token_share', "first token's share of the row")):
            for variant, runs in by.items():
                layers = list(zip(*[r[key] for r in runs]))
                means = [statistics.fmean(v) for v in layers]
                stds = [statistics.stdev(v) if len(v) > 1 else 0 for v in layers]
                ax.errorbar(range(1, len(means) + 1), means, yerr=stds, marker='o', capsize=3, label=variant)
            ax.axhline(results['uniform_first_token'], color='grey', linestyle=':', label='uniform attention')
            ax.set(title=f"Figure 4 ({arm}): {title}", xlabel='layer', ylabel=key.replace('_', ' '))
            ax.set_xticks(range(1, results['layers'] + 1))
            ax.legend(fontsize=8)
        fig.tight_layout()
        names.append(f'fig4_{arm}.png')
        fig.savefig(os.path.join(out_dir, names[-1]), dpi=110)
        plt.close(fig)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for variant, runs in by.items():
            for i, run in enumerate(runs):
                tokens = [p['tokens'] / 1e6 for p in run['curve']]
                style = dict(color=f"C{list(by).index(variant)}", label=variant if i == 0 else None, linewidth=1)
                axes[0].plot(tokens, [statistics.fmean(p['first_token_weight']) for p in run['curve']], **style)
                axes[1].plot(tokens, [p['sink_rate'] for p in run['curve']], **style)
        axes[0].axhline(results['uniform_first_token'], color='grey', linestyle=':', label='uniform attention')
        axes[0].set(title=f"first-token weight, mean over layers ({arm})", xlabel='training tokens (M)',
                    ylabel='weight')
        axes[1].set(title=f"Sink_1^{SINK_THRESHOLD} ({arm}): share of heads", xlabel='training tokens (M)',
                    ylabel='share of heads')
        for ax in axes:
            ax.legend(fontsize=8)
        fig.tight_layout()
        names.append(f'curves_{arm}.png')
        fig.savefig(os.path.join(out_dir, names[-1]), dpi=110)
        plt.close(fig)
    return names


def describe_corpus(corpus):
    if corpus['source'] != 'stdlib':
        return f"prepare_data.py --source={corpus['source']} ({corpus['data_dir']})"
    return (f"Python {corpus['python']}'s standard library, {corpus['files']:,} .py files, {corpus['bytes']:,} bytes, "
            f"sha256 {corpus['sha256'][:16]}… (another Python version has other files: the numbers move slightly)")


def report_lines(results, figure_names):
    r0 = results
    lines = ['# The sink study', '',
             f"Command: `{r0['command']}`. Machine: {r0['machine']}. Wall time: {minutes(r0['seconds'])}.", '',
             f"Corpus: {describe_corpus(r0['corpus'])}. Every {r0['context']}-token window starts with token "
             f"{r0['bos_id']} (<|endoftext|>). Recipe: {r0['recipe_text']}. Uniform attention would put "
             f"{r0['uniform_first_token']:.4f} on the first token.", '',
             '## What the study found', '',
             "Each line is one of the paper's claims, tested per arm; a difference counts only where it exceeds two "
             "standard errors of the difference of the means over seeds (with one seed there is no noise estimate, "
             "and no difference is called within noise).", *verdicts(results), '',
             f"For scale, a real pretrained model, SmolLM2-135M-Instruct, puts {SMOLLM2['first_token_mean']} of its "
             f"attention on the first token on average over its 30 layers, {SMOLLM2['first_token_max']} in its "
             f"largest layer ({SMOLLM2['source']}).", '']
    for arm in results['arms']:
        by = {v: runs for (a, v), runs in groups(results).items() if a == arm}
        lines += [f"## {arm.upper()} arm", '',
                  '| variant | runs | val loss | first-token weight | share | sink mass | Sink₁^0.3 | entropy | '
                  'row sum | spikes k=6 | spikes k=9 | sink appears at |', '|---|' + '---|' * 11]
        for variant, runs in by.items():
            onsets = [sink_onset(r) for r in runs]
            onset = ', '.join('never' if t is None else f"{t / 1e6:.1f}M" for t in onsets)
            sink = [layer_mean(r['sink_mass']) for r in runs]
            lines.append(
                f"| {variant} | {len(runs)} | {fmt(mean_std([r['val_loss'] for r in runs]))} | "
                f"{fmt(mean_std([first_token_weight(r) for r in runs]))} | {fmt(mean_std([first_token_share(r) for r in runs]))} | "
                f"{fmt(mean_std(sink))} | {fmt(mean_std([r['sink_rate'] for r in runs]), 2)} | "
                f"{fmt(mean_std([layer_mean(r['entropy']) for r in runs]), 2)} | "
                f"{fmt(mean_std([layer_mean(r['row_sum']) for r in runs]))} | "
                f"{fmt(mean_std([r['spikes']['6'] for r in runs]), 1)} | "
                f"{fmt(mean_std([r['spikes']['9'] for r in runs]), 1)} | {onset} |")
        lines += ['', 'Per layer (Figure 4), first-token weight, mean ± std over seeds:', '',
                  '| variant | ' + ' | '.join(f"layer {i + 1}" for i in range(results['layers'])) + ' |',
                  '|---|' + '---|' * results['layers']]
        for variant, runs in by.items():
            per_layer = [mean_std(v) for v in zip(*[r['first_token_weight'] for r in runs])]
            lines.append(f"| {variant} | " + ' | '.join(fmt(ms) for ms in per_layer) + ' |')
        lines += ['', f"![Figure 4, {arm}](fig4_{arm}.png)", '', f"![curves, {arm}](curves_{arm}.png)", '']
    lines += ['Columns: means over layers of the last evaluation, on the same fixed validation windows for every '
              'run; ± the sample std over seeds. First-token weight: the weight queries after position 0 put on '
              'position 0, averaged over heads and queries. Share: that weight over the row\'s total (affine\'s '
              'rows do not sum to one). Sink mass: the weight on a learned sink (sink, softmax1), where there is '
              'one. Sink₁^0.3: the share of all heads whose mean first-token weight exceeds 0.3 (Gu et al.). '
              'Spikes: Table 5\'s rule over every step. "Sink appears at": the first evaluation with Sink₁^0.3 > 0, '
              'per seed.']
    return lines


def readme_lines(results):
    """The README's block on the study (tests/test_sink_study.py holds the README to it for the committed
    docs/sink_study/results.json): per variant and arm, the first-token weight (mean over layers, and its largest
    layer), Sink_1^0.3 and the validation loss, mean ± std over seeds; then the claims on the first token, as
    report.md states them."""
    by, arms = groups(results), results['arms']
    header = ['variant'] + [f"{arm.upper()}: {col}" for arm in arms
                            for col in ('first-token weight', 'largest layer', 'Sink₁^0.3', 'val loss')]
    seconds = {arm: statistics.fmean(r['seconds'] for r in results['runs'] if r['arm'] == arm) for arm in arms}
    per_run = '; '.join(f"a {arm.upper()} run's steps {minutes(seconds[arm])} on average" for arm in arms)
    lines = [f"`{results['command']}` ({minutes(results['seconds'])} on {results['machine']}; "
             f"{results['recipe']['tokens']:,} tokens per run; {per_run}; uniform attention puts "
             f"{results['uniform_first_token']:.4f} on the first token):", '',
             '| ' + ' | '.join(header) + ' |', '|---|' + '---|' * (len(header) - 1)]
    for variant in dict.fromkeys(v for _, v in by):
        cells = [variant]
        for arm in arms:
            runs = by.get((arm, variant), [])
            cells += [fmt(mean_std([first_token_weight(r) for r in runs])),
                      fmt(mean_std([max(r['first_token_weight']) for r in runs])),
                      fmt(mean_std([r['sink_rate'] for r in runs]), 2), fmt(mean_std([r['val_loss'] for r in runs]))]
        lines.append('| ' + ' | '.join(cells) + ' |')
    first_token_claims = ('**', '- first-token weight', '- the same, as a share', '- gated attention')
    for line in verdicts(results):
        if line.startswith(first_token_claims) or (not line and lines[-1]):
            lines.append(line)
    return lines

# -----------------------------------------------------------------------------

RECIPE_KEYS = ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'block_size', 'global_batch_size', 'learning_rate', 'min_lr',
               'warmup_iters', 'decay_frac', 'weight_decay', 'beta1', 'beta2', 'grad_clip', 'max_iters', 'first_token',
               'attention_windows', 'kd_alpha', 'kd_temperature')


def prepare_corpus(args):
    """The stdlib corpus in byte tokens at data_dir, unless data_dir holds a complete prepare_data.py output already
    (whatever its source: results.json records which); an interrupted one is continued."""
    meta = os.path.join(HERE, args.data_dir, 'meta.json')
    if os.path.isfile(meta):
        with open(meta) as f:
            if json.load(f).get('complete'):
                return
    command = [sys.executable, 'prepare_data.py', '--source=stdlib', '--tokenizer=bytes', f'--out_dir={args.data_dir}',
               '--val_every=50']
    print(f"$ {shlex.join(command)}", flush=True)
    if subprocess.call(command, cwd=HERE) != 0:
        raise RunError("preparing the corpus failed (above): fix it and run the same command again")


def collect(args, runs, steps, per_step, command, seconds):
    from data import read_meta
    meta = read_meta(os.path.join(HERE, args.data_dir))
    config = runs[0]['config']
    source = meta['settings']['source']
    recipe = {key: config[key] for key in RECIPE_KEYS}
    recipe['tokens'] = steps * per_step
    import torch
    results = dict(
        schema_version=SCHEMA_VERSION, command=command, seconds=round(seconds, 1),
        machine=f"{platform.platform()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, torch "
                f"{torch.__version__}, device {args.device}, {args.jobs} job(s)",
        corpus=dict(source=source['source'], python=source.get('python'), **source.get('corpus', {}),
                    data_dir=args.data_dir),
        bos_id=meta['tokenizer']['bos_id'] if meta['tokenizer']['bos_id'] is not None else meta['tokenizer']['eos_id'],
        context=config['block_size'], layers=config['n_layer'], recipe=recipe,
        recipe_text=', '.join(f"{k}={v}" for k, v in recipe.items()),
        teacher=os.path.join(args.out_dir, 'runs', TEACHER) if 'kd' in args.arms else None,
        uniform_first_token=uniform_first_token(config['block_size']), arms=[a for a in ('ce', 'kd') if a in args.arms],
        runs=[run_result(r, steps, per_step) for r in runs])
    return results


def main(argv=None):
    keys = study_keys(tuple(ATTENTIONS))
    mine, overrides = split_argv(sys.argv[1:] if argv is None else argv, keys)
    args = parse(mine, keys, __doc__.split('\n\n')[1], prog='sink_study.py')
    args = type('Args', (), args)
    claim_dir(os.path.join(HERE, args.out_dir), 'sink_study.py', writes=['results.json', 'report.md'],
              ours=lambda names: 'runs' in names or 'results.json' in names)
    if args.jobs == 0:
        args.jobs = os.cpu_count() or 1 if args.device == 'cpu' else 1
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.device == 'cpu' else 1
    runs, steps, per_step = plan_runs(args, overrides)
    command = shlex.join(['python', 'sink_study.py', *(sys.argv[1:] if argv is None else argv)])
    t0 = time.time()
    if not args.report_only:
        prepare_corpus(args)
        for run in runs:
            run['state'] = state(run)
        todo = [r for r in runs if r['state'] != 'done']
        print(f"{len(runs)} runs of {steps:,} steps ({steps * per_step:,} tokens) each, {len(runs) - len(todo)} done "
              f"already; {args.jobs} at a time, {threads} thread(s) each", flush=True)
        logs = os.path.join(HERE, args.out_dir, 'logs')
        os.makedirs(logs, exist_ok=True)
        run_all(runs, steps, args.jobs, threads, logs)
    results = collect(args, runs, steps, per_step, command, time.time() - t0)
    out = os.path.join(HERE, args.out_dir)
    write_json(os.path.join(out, 'results.json'), results)
    names = figures(results, out)
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write('\n'.join(report_lines(results, names)) + '\n')
    print(f"wrote {args.out_dir}/report.md and results.json in {minutes(time.time() - t0)}")
    return results


if __name__ == '__main__':
    run_script(main)
