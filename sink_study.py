"""
The sink study: does softmax attention, trained by this repo, grow a first-token sink, and do the paper's claims
about each attention variant hold where it does? Figure 4's picture (the first token's weight per layer, affine <
sink < softmax) and the paper's other claims, at a scale two CPU cores can train, with enough seeds for tests that
were fixed before the runs (CLAIMS; significance.py), measured as the field measures a sink (probes.py).

    python sink_study.py                      # the pilot: 4 variants x 3 seeds x 2 arms -> out/sink_study/report.md
    python sink_study.py --plan=full --report_dir=docs/sink_study   # the committed study (about 80 runs, in parts)
    python sink_study.py --device=cuda                              # 4 runs side by side on one GPU
    python sink_study.py --variants=softmax,affine --seeds=1,2,3 --arms=ce --tokens=2000000 --learning_rate=1e-3

The recipe (config/sink_study.py; docs/analysis.md tells how it was found): the quick start's tiny shape on 128-token
windows of Python's standard library (prepare_data.py --source=stdlib, byte tokens) that all begin with
<|endoftext|> (train.py's first_token='prefix'), trained with a large learning rate and weight decay: the setting in
which Gu et al. (ICLR 2025, arXiv 2410.10781) find that softmax grows a sink. Every variant gets the same recipe,
data, tokens and seeds; none is tuned on its own. Any train.py key given here (--learning_rate=...) changes the
recipe of every run alike.

Arms: kd, the paper's setting (Figure 4 shows distilled students): each variant distilled (pure KD) from a ce
softmax run, student seed s from teacher --teachers[(s - 1) mod count], so that students are permuted within a
teacher; ce, each variant trained from scratch with cross-entropy (outside the paper's setting); control, kd with
weight decay off on alpha_proj and g_proj (train.py's no_decay), for affine and gated; recipe, the ce softmax run of
seed 0, the seed the recipe was searched on, reported and never tested (no seed 0 enters a test).

Each run is one train.py run in out_dir/train/<arm>_<variant>_s<seed> (its metrics.jsonl and ckpt.pt), --jobs at a
time. Its evaluations measure the attention on fixed validation windows (probes.sink_record); at its end the study
measures Gu et al.'s own setting, W8A8 and the knockout on its checkpoint, and writes its record,
report_dir/runs/<name>.json. results.json, report.md and the figures aggregate every record there whose recipe is
this command's; a re-run trains only what has no record, continuing interrupted runs from their checkpoints.
"""
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import significance as sig
from configurator import Key, parse
from files import RunError, atomic_write, claim_dir, run_script, write_json
from model import ATTENTIONS, PAPER_VARIANTS
from probes import GU_LENGTH, GU_SAMPLES, SINK_STUDY_EVALUATIONS as EVALUATIONS, SINK_THRESHOLD, layer_mean

SOFTMAX, SINK, GATED, AFFINE, AFFINE_GATED = PAPER_VARIANTS  # the paper's five, in its order
CORE = [SOFTMAX, SINK, GATED, AFFINE]  # the variants of the claims
EXTRA = [v for v in ATTENTIONS if v not in CORE]  # affine_gated and ours (softmax1): fewer seeds, numbers
RECIPE_SEED = 0  # the seed the recipe was searched on (softmax, ce): reported, never in a test
NO_DECAY = ['alpha_proj', 'g_proj']  # the control arm's matrices without weight decay
FINAL_KD_STEPS = 50  # a kd run's final KD loss: the mean of its last 50 steps' kd_loss
SPIKE_KS, SPIKE_WINDOW = (6, 9), (0, 500)  # Table 5: median + k MAD over steps 0-500 (a shorter run: all its steps)
END_WINDOWS, CALIBRATION = 32, 4  # validation windows of W8A8 and the knockout; W8A8's calibration windows after them

GPU_JOBS = 4  # runs side by side on one GPU: a 0.8M-parameter model leaves most of it idle (not measured: an estimate)

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = 'config/sink_study.py'
SCHEMA_VERSION = 2
ARMS = ('recipe', 'ce', 'kd', 'control')
PLANS = {  # what --plan sets (each key may still be given after it)
    'pilot': dict(variants=CORE, arms=['ce', 'kd'], seeds=[1, 2, 3], kd_seeds=[1, 2, 3]),
    'full': dict(variants=CORE + EXTRA, arms=list(ARMS), seeds=[1, 2, 3, 4, 5, 6], kd_seeds=list(range(1, 9)),
                 extra_seeds=[1, 2, 3], control_seeds=[1, 2, 3, 4, 5]),
}
# a real pretrained softmax model's first-token weight, for scale: as the quick start's real-model stage measured it
SMOLLM2 = dict(first_token_mean=0.36, first_token_max=0.65, source=(
    "python quickstart.py's real-model stage: SmolLM2-135M-Instruct (analyze.py attention on the built-in corpus in "
    "its tokens, 4 x 256 tokens; docs/analysis.md)"))


def study_keys(variants):
    return dict(
        plan=Key('pilot', "pilot: the 4 core variants, seeds 1-3, ce and kd; full: the committed study (every arm, "
                 "core seeds 1-6 ce and 1-8 kd, affine_gated and softmax1 seeds 1-3, control seeds 1-5)",
                 choices=tuple(PLANS), expands=PLANS),
        out_dir=Key('out/sink_study', "where the train.py runs (train/) and their logs (logs/) go"),
        report_dir=Key('', "where the records (runs/), results.json, report.md and the figures go (default: out_dir)"),
        data_dir=Key('data/stdlib_bytes', "the prepared corpus (made here first if missing: prepare_data.py "
                     "--source=stdlib --tokenizer=bytes)"),
        variants=Key(list(PLANS['pilot']['variants']), "comma-separated attention variants (model.py's registry)",
                     choices=variants),
        arms=Key(list(PLANS['pilot']['arms']), "recipe, ce, kd, control (the module's docstring)", choices=ARMS),
        seeds=Key([1, 2, 3], "the ce arm's seeds of the core variants (softmax, sink, gated, affine)", min=0),
        kd_seeds=Key([1, 2, 3], "the kd arm's student seeds of the core variants", min=0),
        extra_seeds=Key([1, 2, 3], "the ce and kd seeds of affine_gated and softmax1 (when in --variants)", min=0),
        control_seeds=Key([1, 2, 3, 4, 5], "the control arm's seeds (affine and gated, kd, no decay on "
                          "alpha_proj, g_proj)", min=0),
        teachers=Key([1, 2], "the ce softmax seeds the kd students distil from (student s: the ((s - 1) mod count)-th)",
                     min=0),
        tokens=Key(3_000_000, "training tokens per run", min=1),
        device=Key('cpu', "cpu, cuda, cuda:1, ... (every run on it)"),
        jobs=Key(0, "runs at once (0: one per CPU core on cpu; on a GPU, GPU_JOBS side by side)", min=0),
        report_only=Key(False, "write results.json and report.md from the records there are, train nothing"),
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


def teacher_of(seed, teachers):
    return f'ce_{SOFTMAX}_s{teachers[(seed - 1) % len(teachers)]}'


def run_matrix(args):
    """[(arm, variant, seed)] the arguments ask for, the ce arm (where the teachers are) first."""
    out = []
    for arm, core in (('ce', args.seeds), ('kd', args.kd_seeds)):
        if arm in args.arms:
            out += [(arm, v, s) for v in args.variants for s in (core if v in CORE else args.extra_seeds)]
    if 'recipe' in args.arms and SOFTMAX in args.variants and ('ce', SOFTMAX, RECIPE_SEED) not in out:
        out.append(('recipe', SOFTMAX, RECIPE_SEED))
    if 'control' in args.arms:
        out += [('control', v, s) for v in (GATED, AFFINE) if v in args.variants for s in args.control_seeds]
    return out


def plan_runs(args, overrides):
    """[run dicts: name, arm, variant, seed, teacher, argv, config], teachers first (the kd and control arms read the
    ce arm's softmax runs of --teachers)."""
    import train
    base = train.load_config([os.path.join(HERE, CONFIG), *overrides])
    per_step = base['global_batch_size'] * base['block_size']
    steps = max(1, round(args.tokens / per_step))
    common = [CONFIG, f'--data_dir={args.data_dir}', f'--device={args.device}', f'--max_iters={steps}',
              f'--eval_interval={max(1, steps // EVALUATIONS)}', *overrides]
    runs = []
    for arm, variant, seed in run_matrix(args):
        name = f'{"ce" if arm == "recipe" else arm}_{variant}_s{seed}'
        teacher = teacher_of(seed, args.teachers) if arm in ('kd', 'control') else None
        argv = [*common, f'--attention={variant}', f'--seed={seed}', f"--out_dir={train_dir(args, name)}"]
        argv += [f'--teacher={train_dir(args, teacher)}'] if teacher else []
        argv += [f"--no_decay={','.join(NO_DECAY)}"] if arm == 'control' else []
        runs.append(dict(name=name, arm=arm, variant=variant, seed=seed, teacher=teacher, argv=argv))
    names = {r['name'] for r in runs}
    for teacher in sorted({r['teacher'] for r in runs if r['teacher']} - names):
        seed = int(teacher.rsplit('_s', 1)[1])
        runs.insert(0, dict(name=teacher, arm='teacher', variant=SOFTMAX, seed=seed, teacher=None,
                            argv=[*common, f'--attention={SOFTMAX}', f'--seed={seed}',
                                  f"--out_dir={train_dir(args, teacher)}"]))
    for run in runs:  # every run's settings checked before any work (train.py's own messages)
        run['config'] = train.load_config([os.path.join(HERE, run['argv'][0]), *run['argv'][1:]])
    return runs, steps, per_step


def train_dir(args, name):
    return os.path.join(args.out_dir, 'train', name)


RECIPE_KEYS = ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'block_size', 'global_batch_size', 'learning_rate', 'min_lr',
               'warmup_iters', 'decay_frac', 'weight_decay', 'beta1', 'beta2', 'grad_clip', 'max_iters', 'first_token',
               'attention_windows', 'kd_alpha', 'kd_temperature')


def recipe_of(config, per_step):
    """What every run of one study shares (its arm adds no_decay): records of another recipe are never mixed in."""
    return {key: config[key] for key in RECIPE_KEYS} | dict(tokens=config['max_iters'] * per_step)


def state(run, records, per_step):
    """recorded (its record has this recipe), or train.py's state of its run: done / partial / new / changed
    (train.planned_run, the rule the quick start applies too: the same settings continue, changed ones train again
    from scratch)."""
    import resume
    import train
    record = records.get(run['name'])
    if record and record['recipe'] == recipe_of(run['config'], per_step) and record['teacher'] == run['teacher']:
        return 'recorded'
    c, step, changed = train.planned_run([os.path.join(HERE, run['argv'][0]), *run['argv'][1:]], cwd=HERE)
    run['extra'], run['note'] = (resume.RESTART, resume.restart_note(c['out_dir'], changed)) if changed else ([], '')
    return 'new' if step is None else 'changed' if changed else 'done' if step >= c['max_iters'] else 'partial'

# -----------------------------------------------------------------------------
# Running: --jobs train.py processes at once, progress and an ETA on the console; a record per finished run


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


def priority(run, runs):
    """The order runs start in: teachers, then the kd arm (the paper's setting), ce, the control, the extra variants
    and the recipe's seed, each by seed: a study stopped part way has the most useful runs."""
    teacher = any(r['teacher'] == run['name'] for r in runs)
    arm = dict(kd=1, ce=2, control=3, recipe=5).get(run['arm'], 0)
    return (0 if teacher else arm + 3 * (run['variant'] in EXTRA), run['seed'])


def run_all(runs, steps, jobs, threads, logs, finished):
    """Train every run whose state is not recorded or done, `jobs` at a time (a student once its teacher is done) in
    priority's order, printing progress; finished(run) as each ends, and for those done already one per second
    while the others train."""
    todo = sorted((r for r in runs if r['state'] not in ('recorded', 'done')), key=lambda r: priority(r, runs))
    done_names = {r['name'] for r in runs if r['state'] in ('recorded', 'done')}
    unrecorded = [r for r in runs if r['state'] == 'done']
    running, t0, last_print = {}, time.time(), 0
    start_steps = {r['name']: last_step(r['config']['out_dir']) for r in todo}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    while todo or running or unrecorded:
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
                finished(run)
                print(f"finished {name} ({len(done_names)}/{len(runs)} runs)", flush=True)
        ready = [r for r in todo if r['teacher'] is None or r['teacher'] in done_names]
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
            raise RunError(f"{todo[0]['name']} waits for its teacher {todo[0]['teacher']}, which is not planned")
        if unrecorded:
            finished(unrecorded.pop(0))
            continue
        if time.time() - last_print >= 30 or not running:
            last_print = time.time()
            progress(runs, running, steps, start_steps, t0)
        time.sleep(1)


def progress(runs, running, steps, start_steps, t0):
    """One console line: runs finished, each running run's step, and an ETA from the steps done since the start."""
    now = {r['name']: steps if r['state'] == 'recorded' else last_step(r['config']['out_dir']) for r in runs}
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
# A run's record: its last evaluation's measures, its curve, its spikes and KD loss, and the end-of-run measures


def end_measures(out_dir, data_dir):
    """What the study measures on a finished run's checkpoint (probes.py; analyze.py attention measures the same
    on any model): Gu et al.'s Sink_1 in their setting (GU_SAMPLES validation windows of GU_LENGTH tokens, starting
    with the run's first token), W8A8 (ranges from CALIBRATION windows after the END_WINDOWS it evaluates), the
    knockout (window: a quarter of the context) on END_WINDOWS windows, and Figure 3's spread: the standard deviation
    of the per-query row totals (each query i >= 1's sum_j w_ij, averaged over heads) over the attention windows,
    per layer."""
    import torch
    from data import Windows, first_token_id, read_meta
    from model import GPT
    from probes import attention_statistics, knockout_losses, sink_rates, w8a8_losses
    torch.set_num_threads(1)
    model = GPT.from_pretrained(os.path.join(HERE, out_dir)).eval()
    with open(os.path.join(HERE, out_dir, 'config.json')) as f:
        config = json.load(f)
    first = first_token_id(config, read_meta(os.path.join(HERE, data_dir))['tokenizer'])
    T = config['block_size']

    def windows(length, indices):  # (N, length) validation windows, as the run's evaluations read them
        return torch.from_numpy(Windows(os.path.join(HERE, data_dir), 'val', length, first).get(indices)[0])

    gu = sink_rates(model, windows(min(GU_LENGTH, T), range(GU_SAMPLES)), batch_size=GU_SAMPLES // 4)
    sequences = windows(T, range(END_WINDOWS))
    calibration = windows(T, range(END_WINDOWS, END_WINDOWS + CALIBRATION))
    w8a8 = w8a8_losses(model, calibration, sequences, batch_size=16)
    knockout = knockout_losses(model, sequences, batch_size=16)
    knockout |= {f'ratio_{k}': knockout[k] / knockout['full'] for k in list(knockout) if k.startswith('first_')}
    layers = attention_statistics(model, windows(T, range(config['attention_windows'] or 8)))
    spread = [layer['row_sums'][:, 1:].std().item() for layer in layers]
    return dict(gu=gu, w8a8=w8a8, knockout=knockout, row_total_std=spread)


def timed_end_measures(out_dir, data_dir):
    t0 = time.time()
    end = end_measures(out_dir, data_dir)
    return dict(end=end, end_seconds=round(time.time() - t0, 1))


# what train.py logs at every step (its evaluations add the rest)
STEP_KEYS = ('step', 'lr', 'loss', 'grad_norm', 'tokens_per_sec', 'mfu', 'dt', 'peak_memory_gib', 'kd_loss', 'ce_loss',
             'teacher_sec', 'skipped_steps')


def make_record(run, per_step, data_dir):
    """The record of a finished run (report_dir/runs/<name>.json; docs/analysis.md documents it)."""
    from analyze import load_run, spike_counts
    loaded = load_run(os.path.join(HERE, run['config']['out_dir']))
    records = loaded['records']
    evals = [r for r in records if 'first_token_weight' in r]
    steps = run['config']['max_iters']
    if not evals or records[-1]['step'] < steps:
        raise RunError(f"{run['config']['out_dir']}: the run has not finished ({records[-1]['step']} of {steps} steps)")
    last = evals[-1]
    grad = [r['grad_norm'] for r in records]
    kd = [r['kd_loss'] for r in records if 'kd_loss' in r]
    measured = [k for k in last if k not in STEP_KEYS]  # the evaluation's keys (train.evaluation_record)
    curve = [dict(tokens=r['step'] * per_step, **{k: r[k] for k in measured if not k.endswith('_per_head')})
             for r in evals]
    measures = {'sink_mass': None} | {k: last[k] for k in measured}  # sink_mass: null where no null slot (schema 1)
    recipe = recipe_of(run['config'], per_step)
    return dict(
        schema_version=SCHEMA_VERSION, name=run['name'], arm=run['arm'], variant=run['variant'], seed=run['seed'],
        teacher=run['teacher'], recipe=recipe, no_decay=run['config']['no_decay'], tokens=last['step'] * per_step,
        seconds=round(sum(r['dt'] for r in records), 1),
        machine=f"{platform.platform()}, {os.cpu_count()} CPU cores, device {run['config']['device']}",
        **measures, per_head=last['first_token_per_head'],
        final_kd_loss=statistics.fmean(kd[-FINAL_KD_STEPS:]) if kd else None,
        spikes={str(k): n for k, n in spike_counts(grad, SPIKE_KS, 0, min(SPIKE_WINDOW[1], len(grad))).items()},
        spikes_window=[0, min(SPIKE_WINDOW[1], len(grad))],
        spikes_whole_run={str(k): n for k, n in spike_counts(grad, SPIKE_KS, 0, len(grad)).items()},
        **timed_end_measures(run['config']['out_dir'], data_dir), curve=curve,
        ckpt=os.path.join(run['config']['out_dir'], 'ckpt.pt'))


def read_records(report_dir):
    """{name: record} of report_dir/runs/*.json."""
    folder = os.path.join(HERE, report_dir, 'runs')
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith('.json'):
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            out[record['name']] = record
    return out

# -----------------------------------------------------------------------------
# The claims, fixed before the runs (docs/analysis.md), and their tests (significance.py)

# measure name -> (what it is, its value in a record)
MEASURES = {
    'weight': ("the first token's raw weight, mean over layers (Figure 4's own measure)",
               lambda r: layer_mean(r['first_token_weight'])),
    'share': ("the first token's share of each row's total, mean over layers",
              lambda r: layer_mean(r['first_token_share'])),
    'first_or_null': ("the first token's weight plus the null mass (the paper's Figure 9 reading of sink), mean "
                      "over layers", lambda r: layer_mean(r['first_or_null'])),
    'entropy': ("attention entropy (of the weights' magnitudes normalised over the visible keys), mean over all layers",
                lambda r: layer_mean(r['entropy'])),
    'entropy_deep': ("the same over the deeper half of the layers",
                     lambda r: layer_mean(r['entropy'][len(r['entropy']) // 2:])),
    'loss': ("kd arm: the final KD loss (mean of the last 50 steps); ce arm: the CE validation loss of the last "
             "evaluation", lambda r: r['final_kd_loss'] if r['arm'] in ('kd', 'control') else r['val_loss']),
    'spikes9': ("gradient-norm spikes over steps 0-500, median + 9 MAD (Table 5)", lambda r: r['spikes']['9']),
    'row_spread': ("the standard deviation of the per-query row totals over the windows' queries (Figure 3's "
                   "spread), mean over layers", lambda r: layer_mean(r['end']['row_total_std'])),
    'sink_grown': ("1 where Gu et al.'s Sink_1^0.3 in their setting (100 x 64, the first token among the tokens) is "
                   "above 0, else 0", lambda r: float(r['end']['gu']['sink_rate'] > 0)),
    'w8a8': ("the W8A8 loss over the full-precision loss", lambda r: r['end']['w8a8']['ratio']),
    'knockout0': ("the loss with the first token evicted (k = 0, window a quarter of the context) over full "
                  "attention's", lambda r: r['end']['knockout']['ratio_first_0']),
    'val_loss': ("the CE validation loss of the last evaluation", lambda r: r['val_loss']),
}

# (id, family, source, measure, low, direction, high): the claim is `low direction high` in each arm it names
CLAIMS = [
    ('fig4_affine_sink', 'primary', 'Figure 4', 'weight', AFFINE, '<', SINK),
    ('fig4_sink_softmax', 'primary', 'Figure 4', 'weight', SINK, '<', SOFTMAX),
    ('fig6_affine_sink', 'primary', 'Figure 6', 'entropy', AFFINE, '>', SINK),
    ('fig6_affine_softmax', 'primary', 'Figure 6', 'entropy', AFFINE, '>', SOFTMAX),
    ('fig7_affine_softmax', 'primary', 'Figures 7 and 10', 'loss', AFFINE, '<', SOFTMAX),
    ('fig7_affine_sink', 'primary', 'Figures 7 and 10', 'loss', AFFINE, '<', SINK),
    ('table5_affine_softmax', 'primary', 'Table 5 (k = 9)', 'spikes9', AFFINE, '<', SOFTMAX),
    ('fig4_share_affine_sink', 'secondary', 'Figure 4, by share', 'share', AFFINE, '<', SINK),
    ('fig4_share_sink_softmax', 'secondary', 'Figure 4, by share', 'share', SINK, '<', SOFTMAX),
    ('fig4_null_affine_sink', 'secondary', 'Figure 4, first-token-or-null', 'first_or_null', AFFINE, '<', SINK),
    ('fig4_null_sink_softmax', 'secondary', 'Figure 4, first-token-or-null', 'first_or_null', SINK, '<', SOFTMAX),
    ('fig6_deep_affine_sink', 'secondary', 'Figure 6, deeper half', 'entropy_deep', AFFINE, '>', SINK),
    ('fig6_deep_affine_softmax', 'secondary', 'Figure 6, deeper half', 'entropy_deep', AFFINE, '>', SOFTMAX),
    ('fig3_spread_affine_sink', 'secondary', 'Figure 3', 'row_spread', AFFINE, '>', SINK),
    ('qiu_gate_share', 'secondary', 'Qiu et al. (the gate)', 'share', GATED, '<', SOFTMAX),
    ('gu_affine', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', AFFINE, '<', SOFTMAX),
    ('gu_sink', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', SINK, '<', SOFTMAX),
    ('gu_gated', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', GATED, '<', SOFTMAX),
    ('w8a8_affine_softmax', 'secondary', 'the payoff: W8A8', 'w8a8', AFFINE, '<', SOFTMAX),
    ('w8a8_affine_sink', 'secondary', 'the payoff: W8A8', 'w8a8', AFFINE, '<', SINK),
    ('knockout_affine_softmax', 'secondary', 'the payoff: knockout', 'knockout0', AFFINE, '<', SOFTMAX),
    ('knockout_affine_sink', 'secondary', 'the payoff: knockout', 'knockout0', AFFINE, '<', SINK),
]
CLAIM_ARMS = ('kd', 'ce')  # each claim is tested in both, kd (the paper's setting) first
CONTROL_MEASURES = ('weight', 'share', 'loss')  # did turning decay off on alpha_proj, g_proj move these?


def tested(records, arm, variant):
    """The records of (arm, variant) that enter tests: never the recipe's seed."""
    return [r for r in records if r['arm'] == arm and r['variant'] == variant and r['seed'] != RECIPE_SEED]


def compare(a, b, measure, direction, family_size, fisher=False):
    """One comparison of groups a and b (records) on a measure: means, stds, the test's raw p, the 95% interval of
    the difference (bootstrap, within teachers in the kd arm) and the seeds a difference of this size would need."""
    values = lambda runs: [MEASURES[measure][1](r) for r in runs]
    va, vb = values(a), values(b)
    strata = lambda runs: [r['teacher'] for r in runs] if any(r['teacher'] for r in runs) else None
    out = dict(n=[len(a), len(b)], mean=[statistics.fmean(va) if va else None, statistics.fmean(vb) if vb else None],
               std=[statistics.stdev(v) if len(v) > 1 else None for v in (va, vb)], seeds=[[r['seed'] for r in a],
                                                                                          [r['seed'] for r in b]])
    if not va or not vb:
        return out | dict(p=None)
    out['difference'] = out['mean'][0] - out['mean'][1]
    if fisher:
        out['test'] = "Fisher's exact"
        out['p'] = sig.fisher_exact(int(sum(va)), len(va), int(sum(vb)), len(vb))
    else:
        out['test'] = 'exact permutation' + (' within teachers' if strata(a) else '')
        out['p'] = sig.permutation_test(va, vb, strata(a), strata(b))
    out['interval'] = list(sig.bootstrap_interval(va, vb, strata(a), strata(b)))
    out['needed'] = sig.seeds_needed(va, vb, family_size, proportions=fisher) if len(va) > 1 and len(vb) > 1 else None
    return out


def test_claims(records):
    """Every claim in each arm of CLAIM_ARMS, with Holm's correction within each (arm, family) over the comparisons
    that have at least MIN_SEEDS seeds on both sides; and the control arm against kd. A list of result dicts."""
    out = []
    for arm in CLAIM_ARMS:
        for family in ('primary', 'secondary'):
            claims = [c for c in CLAIMS if c[1] == family]
            size = sum(min(len(tested(records, arm, c[4])), len(tested(records, arm, c[6]))) >= sig.MIN_SEEDS
                       for c in claims) or 1
            results = []
            for cid, _, source, measure, low, direction, high in claims:
                a, b = tested(records, arm, low), tested(records, arm, high)
                result = compare(a, b, measure, direction, size, fisher=measure == 'sink_grown')
                results.append(dict(id=cid, arm=arm, family=family, source=source, measure=measure, low=low,
                                    direction=direction, high=high, **result))
            holm_set = [r for r in results if r['p'] is not None and min(r['n']) >= sig.MIN_SEEDS]
            for r, adjusted in zip(holm_set, sig.holm([r['p'] for r in holm_set])):
                r['p_holm'] = adjusted
            for r in results:
                r['verdict'] = (sig.verdict(direction=r['direction'], difference=r['difference'],
                                            p_adjusted=r.get('p_holm', 1.0), n_a=r['n'][0], n_b=r['n'][1],
                                            needed=r['needed']) if r['p'] is not None else 'not measured')
            out += results
    controls = [(v, m) for v in (AFFINE, GATED) for m in CONTROL_MEASURES
                if tested(records, 'control', v) and tested(records, 'kd', v)]
    results = []
    for variant, measure in controls:
        result = compare(tested(records, 'control', variant), tested(records, 'kd', variant), measure, '!=',
                         len(controls))
        results.append(dict(id=f'control_{variant}_{measure}', arm='control', family='control',
                            source='the recipe (weight decay on alpha_proj, g_proj)', measure=measure,
                            low=f'{variant} without decay', direction='!=', high=f'{variant} with decay', **result))
    holm_set = [r for r in results if min(r['n']) >= sig.MIN_SEEDS]
    for r, adjusted in zip(holm_set, sig.holm([r['p'] for r in holm_set])):
        r['p_holm'] = adjusted
    for r in results:
        p = r.get('p_holm')
        r['verdict'] = (f"numbers only (fewer than {sig.MIN_SEEDS} seeds in a group)" if p is None else
                        f"moved (p = {p:.3g})" if p < sig.ALPHA else f"did not move detectably (p = {p:.3g})")
    return out + results

# -----------------------------------------------------------------------------
# results.json, the report, the README's block: all generated from the records


def uniform_first_token(context):
    """The first token's weight under uniform causal attention, averaged over the queries after it: query i (0-based)
    spreads 1 / (i + 1) over i + 1 keys."""
    return sum(1 / (i + 1) for i in range(1, context)) / (context - 1)


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def fmt(ms, digits=3):
    mean, std = ms
    if mean is None:
        return '—'
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else '')


def g(x):
    return '—' if x is None else f"{x:.4g}"


ARM_TITLES = dict(kd="KD arm: the paper's setting (students distilled from softmax teachers)",
                  ce="CE arm: trained from scratch with cross-entropy (outside the paper's setting)",
                  control="Control: kd with weight decay off on alpha_proj and g_proj",
                  recipe="The recipe's seed (ce softmax, seed 0): reported, never tested")


def claim_line(r):
    if r['p'] is None:
        return f"- {r['source']}: {r['low']} {r['direction']} {r['high']} on {r['measure']}: {r['verdict']}."
    (ma, mb), (sa, sb) = r['mean'], r['std']
    ci = r['interval']
    holm = f", Holm-adjusted {g(r['p_holm'])}" if 'p_holm' in r else ''
    return (f"- {r['source']}: {r['low']} {r['direction']} {r['high']} on {r['measure']}: **{r['verdict']}** — "
            f"{r['low']} {g(ma)} ± {g(sa)} ({r['n'][0]} seeds) vs {r['high']} {g(mb)} ± {g(sb)} ({r['n'][1]} seeds); "
            f"difference {g(r['difference'])}, 95% interval [{g(ci[0])}, {g(ci[1])}]; {r['test']} p = {g(r['p'])}"
            f"{holm}.")


def verdict_lines(results, arms=('kd', 'ce', 'control'), families=('primary', 'secondary', 'control')):
    lines = []
    for arm in arms:
        rows = [r for r in results['claims'] if r['arm'] == arm and r['family'] in families]
        if not rows or not any(r['arm'] == arm for r in results['runs']):
            continue
        lines += ['', f"**{ARM_TITLES[arm]}**", '']
        for family in families:
            chosen = [r for r in rows if r['family'] == family]
            if chosen and family != 'control':
                lines += [f"{family.capitalize()} claims (Holm over the {len([r for r in chosen if 'p_holm' in r])} "
                          f"tested):"]
            lines += [claim_line(r) for r in chosen]
    return lines


def counts_in_words(results, arm):
    rows = [r for r in results['claims'] if r['arm'] == arm and r['family'] == 'primary']
    words = [r['verdict'].split(' (')[0] for r in rows]
    named = lambda word: ', '.join(f"{r['source']} ({r['low']} {r['direction']} {r['high']})" for r in rows
                                   if r['verdict'].startswith(word)) or 'none'
    return (f"of the paper's {len(rows)} primary claims, {words.count('supported')} supported ({named('supported')}), "
            f"{words.count('contradicted')} contradicted ({named('contradicted')}), {words.count('not decided')} not "
            f"decided and {sum(w.startswith('numbers only') or w == 'not measured' for w in words)} without a verdict "
            f"(fewer than {sig.MIN_SEEDS} seeds)")


def sink_counts(results, arm):
    by = {}
    for r in results['runs']:
        if r['arm'] == arm and r['seed'] != RECIPE_SEED:
            by.setdefault(r['variant'], []).append(MEASURES['sink_grown'][1](r))
    return ', '.join(f"{v} {int(sum(x))} of {len(x)}" for v, x in by.items())


def in_words(results):
    lines = []
    for arm in ('kd', 'ce'):
        if any(r['arm'] == arm for r in results['runs']):
            lines.append(f"In the {arm.upper()} arm{' (the paper’s setting)' if arm == 'kd' else ''}, "
                         f"{counts_in_words(results, arm)}. {sink_sentence(results, arm)} Seeds that grew a sink, per "
                         f"variant: {sink_counts(results, arm)}.")
    return ' '.join(lines) + (f" One small model ({results['layers']} layers) at {results['recipe']['tokens'] / 1e6:.1f}M "
                              f"tokens a run: a test of the mechanism, not of the paper's scale.")


def table_lines(results, arm):
    by = {}
    for r in results['runs']:
        if r['arm'] == arm:
            by.setdefault(r['variant'], []).append(r)
    lines = ['| variant | seeds | loss | first-token weight | share | first-or-null | value-weighted | Sink₁ (windows) '
             '| Sink₁ > 0 (100 x 64) | entropy | row-total spread | W8A8 ratio | knockout k=0 ratio | spikes k=9 |',
             '|---|' + '---|' * 13]
    for variant, runs in by.items():
        m = lambda key: fmt(mean_std([MEASURES[key][1](r) for r in runs]))
        lines.append(f"| {variant} | {', '.join(str(r['seed']) for r in runs)} | {m('loss')} | {m('weight')} | "
                     f"{m('share')} | {m('first_or_null')} | {fmt(mean_std([layer_mean(r['value_weighted_first']) for r in runs]))} | "
                     f"{fmt(mean_std([r['sink_rate'] for r in runs]), 2)} | "
                     f"{int(sum(MEASURES['sink_grown'][1](r) for r in runs))} of {len(runs)} | {m('entropy')} | "
                     f"{m('row_spread')} | {m('w8a8')} | {m('knockout0')} | {fmt(mean_std([r['spikes']['9'] for r in runs]), 1)} |")
    return lines


def claims_table():
    """The claims as fixed before the runs, one row each (the report and docs/analysis.md show it)."""
    lines = ['| id | family | source | claim | measure | test |', '|---|---|---|---|---|---|']
    for cid, family, source, measure, low, direction, high in CLAIMS:
        test = "Fisher's exact" if measure == 'sink_grown' else 'exact permutation (kd: within teachers)'
        lines.append(f"| {cid} | {family} | {source} | {low} {direction} {high} | {MEASURES[measure][0]} | {test} |")
    return lines


def report_lines(results):
    r0 = results
    lines = ['# The sink study', '',
             f"Command: `{r0['command']}`. Machine: {r0['machine']}. Runs: {len(r0['runs'])} records; "
             f"{per_run_times(r0)}.", '',
             f"Corpus: {describe_corpus(r0['corpus'])}. Every {r0['context']}-token window starts with token "
             f"{r0['bos_id']} (<|endoftext|>). Recipe: {r0['recipe_text']}. Uniform attention would put "
             f"{r0['uniform_first_token']:.4f} on the first token.", '',
             '## What the study found', '', in_words(results), '',
             f"Tests (fixed before the runs; significance.py): per-seed values by an exact two-sided permutation test "
             f"(kd: permuted within a teacher), seeds with a sink by Fisher's exact test, Holm's correction within "
             f"each arm's family at {sig.ALPHA}; intervals are 95% percentile bootstraps ({sig.BOOTSTRAP_SAMPLES:,} "
             f"resamples, seeded); a group with fewer than {sig.MIN_SEEDS} seeds gives numbers only. \"Seeds "
             f"needed\": the normal approximation at Holm's strictest level with power {sig.POWER}, never below the "
             f"exact test's floor.", *verdict_lines(results), '',
             f"For scale, a real pretrained model, SmolLM2-135M-Instruct, puts {SMOLLM2['first_token_mean']} of its "
             f"attention on the first token on average over its 30 layers, {SMOLLM2['first_token_max']} in its "
             f"largest layer ({SMOLLM2['source']}).", '']
    for arm in ('kd', 'ce', 'control', 'recipe'):
        if any(r['arm'] == arm for r in results['runs']):
            lines += [f"## {ARM_TITLES[arm]}", '', *table_lines(results, arm), '']
            if os.path.exists(os.path.join(HERE, results['report_dir'], f'fig4_{arm}.png')):
                lines += [f"![Figure 4, {arm}](fig4_{arm}.png)", '', f"![curves, {arm}](curves_{arm}.png)", '']
    lines += ['## The claims, as fixed before the runs', '', *claims_table(), '',
              'Columns of the tables: means ± std over seeds of the last evaluation (per layer, averaged over layers) '
              'on the same fixed validation windows; the end-of-run measures (Sink₁ in Gu et al.\'s setting, W8A8, '
              'the knockout, the row-total spread) on the run\'s checkpoint. docs/analysis.md defines each.']
    if results['excluded']:
        lines += ['', f"Records left out (another recipe): {', '.join(results['excluded'])}."]
    if results['missing']:
        lines += ['', f"Planned runs without a record yet ({len(results['missing'])}; the same command trains them): "
                      f"{', '.join(results['missing'])}."]
    return lines


def per_run_times(results):
    seconds = {}
    for r in results['runs']:
        seconds.setdefault(r['arm'], []).append(r['seconds'])
    return '; '.join(f"a {arm} run's steps {minutes(statistics.fmean(s))} on average" for arm, s in seconds.items())


def sink_sentence(results, arm):
    """Whether the recipe grew the sink the claims are about: softmax's seeds with Gu et al.'s Sink_1 > 0."""
    grown = [MEASURES['sink_grown'][1](r) for r in results['runs'] if r['arm'] == arm and r['variant'] == SOFTMAX
             and r['seed'] != RECIPE_SEED]
    if not grown:
        return f"No {arm} softmax run has a record yet."
    sentence = f"Softmax grew a sink (Gu et al.'s Sink₁ > 0, 100 x 64) in {int(sum(grown))} of {len(grown)} {arm} seeds"
    if sum(grown) < 2 / 3 * len(grown):
        return sentence + (": fewer than two in three, so the recipe did not reliably grow the sink the claims are "
                           "about, and a first-token claim here compares variants that may all lack one.")
    return sentence + '.'


def pilot_lines(results):
    """docs/analysis.md's pilot table: per arm and primary claim, the pilot's means and spread, the raw p, and the
    seeds per variant a difference of that size would need (significance.seeds_needed: the power calculation); with
    the time of a run and of its end-of-run measures."""
    lines = [' '.join(sink_sentence(results, arm) for arm in ('kd', 'ce')) + f" Runs: {per_run_times(results)}; "
             f"the end-of-run measures took {statistics.fmean(r['end_seconds'] for r in results['runs']):.1f} s a run "
             f"on average.", '',
             '| arm | claim | low: mean ± std | high: mean ± std | difference | p (exact) | seeds needed |',
             '|---|---|---|---|---|---|---|']
    for r in results['claims']:
        if r['family'] == 'primary' and r['p'] is not None:
            lines.append(f"| {r['arm']} | {r['source']}: {r['low']} {r['direction']} {r['high']} ({r['measure']}) | "
                         f"{g(r['mean'][0])} ± {g(r['std'][0])} | {g(r['mean'][1])} ± {g(r['std'][1])} | "
                         f"{g(r['difference'])} | {g(r['p'])} | {r['needed'] or 'no difference'} |")
    return lines


def readme_lines(results):
    """The README's block on the study (tests/test_sink_study.py holds the README to it for the committed
    docs/sink_study/results.json): the command, the primary claims' verdicts of each arm (kd first) and the words."""
    missing = f", {len(results['missing'])} planned runs not yet trained" if results['missing'] else ''
    lines = [f"`{results['command']}` ({len(results['runs'])} runs{missing}, {results['recipe']['tokens']:,} tokens each; "
             f"{per_run_times(results)}; {results['machine']}):"]
    lines += verdict_lines(results, arms=('kd', 'ce'), families=('primary',))
    return lines + ['', 'In words (generated): ' + in_words(results)]


def describe_corpus(corpus):
    if corpus['source'] != 'stdlib':
        return f"prepare_data.py --source={corpus['source']} ({corpus['data_dir']})"
    return (f"Python {corpus['python']}'s standard library, {corpus['files']:,} .py files, {corpus['bytes']:,} bytes, "
            f"sha256 {corpus['sha256'][:16]}… (another Python version has other files: the numbers move slightly)")


def figures(results, out_dir):
    """Per arm: fig4_<arm>.png, the per-layer first-token weight and share, mean ± std over seeds, per variant;
    curves_<arm>.png, the first-token weight (mean over layers) and Gu's Sink_1 on the windows against tokens."""
    from analyze import pyplot
    plt = pyplot()
    for arm in ('kd', 'ce', 'control', 'recipe'):
        by = {}
        for r in results['runs']:
            if r['arm'] == arm:
                by.setdefault(r['variant'], []).append(r)
        if not by:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, title in ((axes[0], 'first_token_weight', 'weight on the first token (raw)'),
                               (axes[1], 'first_token_share', "first token's share of the row")):
            for variant, runs in by.items():
                layers = list(zip(*[r[key] for r in runs]))
                ax.errorbar(range(1, len(layers) + 1), [statistics.fmean(v) for v in layers],
                            yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in layers], marker='o', capsize=3,
                            label=variant)
            ax.axhline(results['uniform_first_token'], color='grey', linestyle=':', label='uniform attention')
            ax.set(title=f"Figure 4 ({arm}): {title}", xlabel='layer', ylabel=key.replace('_', ' '))
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f'fig4_{arm}.png'), dpi=110)
        plt.close(fig)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for variant, runs in by.items():
            for i, run in enumerate(runs):
                tokens = [p['tokens'] / 1e6 for p in run['curve']]
                style = dict(color=f"C{list(by).index(variant)}", label=variant if i == 0 else None, linewidth=1)
                axes[0].plot(tokens, [statistics.fmean(p['first_token_weight']) for p in run['curve']], **style)
                axes[1].plot(tokens, [p['sink_rate'] for p in run['curve']], **style)
        axes[0].set(title=f"first-token weight, mean over layers ({arm})", xlabel='training tokens (M)', ylabel='weight')
        axes[1].set(title=f"Gu et al.'s Sink_1^{SINK_THRESHOLD} on the windows ({arm})", xlabel='training tokens (M)',
                    ylabel='share of (window, layer, head)')
        for ax in axes:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f'curves_{arm}.png'), dpi=110)
        plt.close(fig)


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


CURVE_FIELDS = ('tokens', 'first_token_weight', 'first_token_share', 'sink_rate', 'val_loss')  # results.json's curves


def summary(record):
    """A record as results.json holds it: everything but the per-head lists, its curve's points cut to CURVE_FIELDS
    (the record in runs/ keeps every measure of every evaluation)."""
    return {k: v for k, v in record.items() if not k.endswith('_per_head') and k != 'curve'} | dict(
        curve=[{k: point[k] for k in CURVE_FIELDS} for point in record['curve']])


def collect(args, runs, per_step, command):
    """results.json (schema 2, docs/analysis.md): every record of report_dir/runs with this recipe, the claims'
    tests, and what the report and README need."""
    from data import read_meta
    meta = read_meta(os.path.join(HERE, args.data_dir))
    config = runs[0]['config']
    source = meta['settings']['source']
    recipe = recipe_of(config, per_step)
    records = read_records(args.report_dir)
    planned = {r['name'] for r in runs if r['arm'] != 'teacher'}
    kept = [r for name, r in records.items() if r['recipe'] == recipe]
    excluded = sorted(name for name, r in records.items() if r['recipe'] != recipe)
    missing = sorted(planned - {r['name'] for r in kept})
    order = {(a, v): i for i, (a, v) in enumerate((a, v) for a in ARMS for v in list(ATTENTIONS))}
    kept.sort(key=lambda r: (order.get((r['arm'], r['variant']), 0), r['seed']))
    import torch
    results = dict(
        schema_version=SCHEMA_VERSION, command=command, report_dir=args.report_dir,
        machine=f"{platform.platform()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, torch "
                f"{torch.__version__}, device {args.device}, {args.jobs} job(s)",
        corpus=dict(source=source['source'], python=source.get('python'), **source.get('corpus', {}),
                    data_dir=args.data_dir),
        bos_id=meta['tokenizer']['bos_id'] if meta['tokenizer']['bos_id'] is not None else meta['tokenizer']['eos_id'],
        context=config['block_size'], layers=config['n_layer'], recipe=recipe,
        recipe_text=', '.join(f"{k}={v}" for k, v in recipe.items()), teachers=[teacher_of(s, args.teachers)
                                                                               for s in range(1, len(args.teachers) + 1)],
        uniform_first_token=uniform_first_token(config['block_size']),
        arms=[a for a in ('kd', 'ce', 'control', 'recipe') if any(r['arm'] == a for r in kept)],
        excluded=excluded, missing=missing, runs=[summary(r) for r in kept])
    results['claims'] = test_claims(kept)
    return results


def main(argv=None):
    keys = study_keys(tuple(ATTENTIONS))
    mine, overrides = split_argv(sys.argv[1:] if argv is None else argv, keys)
    args = parse(mine, keys, __doc__.split('\n\n')[1], prog='sink_study.py')
    args = type('Args', (), args)
    args.report_dir = args.report_dir or args.out_dir
    for path, writes in ((args.out_dir, ['train', 'logs']), (args.report_dir, ['results.json', 'report.md'])):
        claim_dir(os.path.join(HERE, path), 'sink_study.py', writes=writes,
                  ours=lambda names: bool({'train', 'runs', 'results.json'} & names))
    if args.jobs == 0:
        args.jobs = os.cpu_count() or 1 if args.device == 'cpu' else GPU_JOBS
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.device == 'cpu' else 1
    runs, steps, per_step = plan_runs(args, overrides)
    # the command that trains these runs (--report_only only rewrites the report from their records)
    command = shlex.join(['python', 'sink_study.py', *(a for a in (sys.argv[1:] if argv is None else argv)
                                                       if not a.startswith('--report_only'))])
    t0 = time.time()
    os.makedirs(os.path.join(HERE, args.report_dir, 'runs'), exist_ok=True)
    if not args.report_only:
        prepare_corpus(args)
        records = read_records(args.report_dir)
        for run in runs:
            run['state'] = state(run, records, per_step)
        for run in runs:  # a teacher with a record but no checkpoint trains again where a student needs it
            students = [r for r in runs if r['teacher'] == run['name'] and r['state'] != 'recorded']
            if run['state'] == 'recorded' and students and not os.path.isfile(
                    os.path.join(HERE, run['config']['out_dir'], 'ckpt.pt')):
                run['state'] = state(run, {}, per_step)
        todo = [r for r in runs if r['state'] not in ('recorded', 'done')]
        print(f"{len(runs)} runs of {steps:,} steps ({steps * per_step:,} tokens) each, {len(runs) - len(todo)} done "
              f"already; {args.jobs} at a time, {threads} thread(s) each", flush=True)
        logs = os.path.join(HERE, args.out_dir, 'logs')
        os.makedirs(logs, exist_ok=True)

        def finished(run):
            if run['arm'] != 'teacher' or not os.path.isfile(os.path.join(HERE, args.report_dir, 'runs',
                                                                          f"{run['name']}.json")):
                record = make_record(run, per_step, args.data_dir)
                record['arm'] = 'ce' if run['arm'] == 'teacher' else run['arm']
                write_json(os.path.join(HERE, args.report_dir, 'runs', f"{run['name']}.json"), record, indent=None)
        run_all(runs, steps, args.jobs, threads, logs, finished)
    results = collect(args, runs, per_step, command)
    out = os.path.join(HERE, args.report_dir)
    write_json(os.path.join(out, 'results.json'), results)
    figures(results, out)
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write('\n'.join(report_lines(results)) + '\n')
    print(f"wrote {args.report_dir}/report.md and results.json ({len(results['runs'])} records) in "
          f"{minutes(time.time() - t0)}")
    return results


if __name__ == '__main__':
    run_script(main)
