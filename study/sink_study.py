"""
The sink study: does softmax attention, trained by this repo, grow a first-token sink, and do the paper's claims
about each attention variant hold where it does? Figure 4's picture (the first token's weight per layer, affine <
sink < softmax) and the paper's other claims, at a scale two CPU cores can train, with enough seeds for tests that
were fixed before the runs (study_results.CLAIMS; study/significance.py), measured as the field measures a sink
(probes.py). This file plans, runs and records; study/study_results.py turns the records into verdicts and words.

    python -m study.sink_study                      # the pilot: 4 variants x 3 seeds x 2 arms ->
    out/sink_study/report.md
    python -m study.sink_study --plan=full --report_dir=docs/sink_study   # the committed study (about 80 runs, in
    parts)
    python -m study.sink_study --device=cuda                              # 4 runs side by side on one GPU
    python -m study.sink_study --plan=v2 --report_dir=docs/sink_study_v2  # v2, sealed (docs/analysis.md, "The seal")
    python -m study.sink_study --plan=gpu --report_dir=docs/sink_study_gpu   # v2's design larger, on one GPU (sealed
    first)
    python -m study.sink_study --variants=softmax,affine --seeds=1,2,3 --arms=ce --tokens=2000000 --learning_rate=1e-3

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
report_dir/runs/<name>.json (study/study_records.py validates every file there before use). results.json, report.md and
the figures aggregate the records this command plans; a record of other seeds or settings stops it unless
--subset=True. A re-run trains only what has no record that may stand for it, continuing interrupted runs from their
checkpoints; SIGTERM or Ctrl-C stops the runs cleanly, and the same command continues them.
"""
import collections
import datetime
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time

if __package__ in (None, ''):  # run as a file: the repository's root on the path, as `python -m` puts it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from study import study_reading, study_records
from configurator import Key, parse
from lmkit.errors import RunError, run_script
from lmkit.files import atomic_write, claim_dir, write_json
from model import ATTENTIONS
from lmkit.probes import GU_LENGTH, GU_SAMPLES, SINK_STUDY_EVALUATIONS as EVALUATIONS
from study.study_records import (ARMS, NO_DECAY, PAYOFF_BITS, PAYOFF_OUTLIERS, RECIPE_KEYS, SCHEMA_VERSION, SEAL_FILE,
                                 SPIKE_KS, record_name)
from study.study_results import (AFFINE, CLAIM_SETS, CORE, EXTRA, GATED, RECIPE_SEED, SEALED_SETS, SOFTMAX, figures,
                                 minutes, report_lines, test_claims, uniform_first_token)

FINAL_KD_STEPS = 50  # a kd run's final KD loss: the mean of its last 50 steps' kd_loss
SPIKE_WINDOW = (0, 500)  # Table 5: median + k MAD over steps 0-500 (a shorter run: all its steps)
END_WINDOWS, CALIBRATION = 32, 4  # validation windows of W8A8 and the knockout; W8A8's calibration windows after them

BLIND = SEALED_SETS  # claim sets whose report waits for the last run (issue 44: no tested measure is read before it)
GPU_JOBS = 4  # runs side by side on one GPU: attempt_1 (docs/sink_study_gpu/) ran each at 337k-421k tokens/s on an H200

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
CONFIG = 'config/sink_study.py'
PLANS = {  # what --plan sets (each key may still be given after it)
    'pilot': dict(variants=CORE, arms=['ce', 'kd'], seeds=[1, 2, 3], kd_seeds=[1, 2, 3]),
    'full': dict(variants=CORE + EXTRA, arms=['recipe', 'ce', 'kd', 'control'], seeds=[1, 2, 3, 4, 5, 6],
                 kd_seeds=list(range(1, 9)), extra_seeds=[1, 2, 3], control_seeds=[1, 2, 3, 4, 5]),
    # v2 (docs/sink_study_v2/): matched pairs distilled from larger teachers of other seeds; sealed (docs/analysis.md)
    'v2': dict(variants=CORE, arms=['kd'], kd_seeds=list(range(1, 13)), teachers=[101, 102],
               config=[CONFIG, 'config/sink_study_v2.py'], teacher_config=['config/sink_study_v2_teacher.py'],
               claims='v2'),
    # v2's design, larger, on one GPU (config/sink_study_gpu.py; its first attempt: docs/sink_study_gpu/attempt_1/)
    'gpu': dict(variants=CORE, arms=['kd'], kd_seeds=[1, 2, 3], teachers=[101], tokens=12_000_000, device='cuda',
                out_dir='out/sink_study_gpu', config=[CONFIG, 'config/sink_study_v2.py', 'config/sink_study_gpu.py'],
                teacher_config=['config/sink_study_gpu_teacher.py'], claims='v2'),
    # v3's pilot: which payoff measure (end.payoff) can leave its floor at this scale, chosen on softmax students alone
    # (v2's recipe and teacher shape, seeds no study has) before v3's claims are fixed; not blind, no claim tested
    'v3_pilot': dict(variants=[SOFTMAX], arms=['kd'], kd_seeds=[901, 902, 903], teachers=[900],
                     out_dir='out/sink_study_v3_pilot', config=[CONFIG, 'config/sink_study_v2.py'],
                     teacher_config=['config/sink_study_v2_teacher.py'], claims='v1'),
}
def study_keys(variants):
    return dict(
        plan=Key('pilot', "pilot: the 4 core variants, seeds 1-3, ce and kd; full: v1, the committed study (every "
                 "arm, core seeds 1-6 ce and 1-8 kd, affine_gated and softmax1 seeds 1-3, control seeds 1-5); v2: the "
                 "sealed confirmatory study (kd, seeds 1-12, two larger teachers); gpu: v2's design larger, on one "
                 "GPU (kd, seeds 1-3); v3_pilot: v2's recipe and teacher shape, softmax students alone (kd, seeds "
                 "901-903, teacher 900), to choose v3's payoff measure (end.payoff)",
                 choices=tuple(PLANS), expands=PLANS),
        out_dir=Key('out/sink_study', "where the train.py runs (train/) and their logs (logs/) go"),
        report_dir=Key('', "where the records (runs/), results.json, report.md and the figures go (default: out_dir)"),
        data_dir=Key('data/stdlib_bytes', "the prepared corpus (made here first if missing: prepare_data.py "
                     "--source=stdlib --tokenizer=bytes)"),
        variants=Key(list(PLANS['pilot']['variants']), "comma-separated attention variants (model.py's registry)",
                     choices=variants),
        arms=Key(list(PLANS['pilot']['arms']), "recipe, ce, kd, control (the module's docstring)",
                 choices=ARMS[:4]),  # a teacher arm comes with --teacher_config
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
        config=Key([CONFIG], "the recipe: the train.py config files every run starts from, in order"),
        teacher_config=Key([], "config files the kd teachers add to the recipe (v2: a larger shape, arm teacher); "
                            "none: the teachers are the ce arm's softmax runs of the recipe (v1)"),
        report_only=Key(False, "write results.json and report.md from the records there are, train nothing"),
        claims=Key('v1', "the claims tested (study_results.CLAIM_SETS): v1's, in the kd and ce arms; v2's, v3's "
                   "and v3_gpu's, in the kd arm", choices=tuple(CLAIM_SETS)),
        subset=Key(False, "report on the records this command plans even though runs/ holds others (of other seeds "
                   "or settings: the report lists them); without it such records stop the study before any work"),
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


def teacher_of(seed, args):
    """The teacher of kd student `seed`: the ((seed - 1) mod count)-th of --teachers, a ce run of the recipe (v1) or
    a run of its own shape (--teacher_config: arm teacher)."""
    arm = 'teacher' if args.teacher_config else 'ce'
    return record_name(arm, SOFTMAX, args.teachers[(seed - 1) % len(args.teachers)])


def with_root(argv):
    """A train.py argv with its config files (the bare arguments) under this repository, wherever it runs from."""
    return [a if a.startswith('--') else os.path.join(HERE, a) for a in argv]


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
    from lmkit.training import load_config
    base = load_config(with_root([*args.config, *overrides]))
    per_step = base['global_batch_size'] * base['block_size']
    steps = max(1, round(args.tokens / per_step))
    common = [f'--data_dir={args.data_dir}', f'--device={args.device}', f'--max_iters={steps}',
              f'--eval_interval={max(1, steps // EVALUATIONS)}', *overrides]
    matrix = run_matrix(args)
    twice = sorted(n for n, k in collections.Counter(record_name(*m) for m in matrix).items() if k > 1)
    if twice:
        raise RunError(f"{', '.join(twice)}: planned twice (a seed given twice?); each run has one directory and one "
                       f"writer: give each seed once")
    runs = []
    for arm, variant, seed in matrix:
        name = record_name(arm, variant, seed)
        teacher = teacher_of(seed, args) if arm in ('kd', 'control') else None
        argv = [*args.config, *common, f'--attention={variant}', f'--seed={seed}', f"--out_dir={train_dir(args, name)}"]
        argv += [f'--teacher={train_dir(args, teacher)}'] if teacher else []
        argv += [f"--no_decay={','.join(NO_DECAY)}"] if arm == 'control' else []
        runs.append(dict(name=name, arm=arm, variant=variant, seed=seed, teacher=teacher, argv=argv))
    names = {r['name'] for r in runs}
    for teacher in sorted({r['teacher'] for r in runs if r['teacher']} - names):
        seed = int(teacher.rsplit('_s', 1)[1])
        runs.insert(0, dict(name=teacher, arm='teacher', variant=SOFTMAX, seed=seed, teacher=None,
                            record_arm='teacher' if args.teacher_config else 'ce',
                            argv=[*args.config, *args.teacher_config, *common, f'--attention={SOFTMAX}',
                                  f'--seed={seed}', f"--out_dir={train_dir(args, teacher)}"]))
    for run in runs:  # every run's settings checked before any work (train.py's own messages)
        run['config'] = load_config(with_root(run['argv']))
        run['config']['dtype'] = planned_dtype(run['config'], args.report_only)
    return runs, steps, per_step


def planned_dtype(config, report_only):
    """The dtype as train.py resolves it and writes it to config.json (a record's settings). A report on records of
    a device this machine lacks (--plan=gpu's, on a CPU) takes 'auto' as it resolves on a bf16 GPU (an older GPU's
    records say float32: give --dtype=float32)."""
    from lmkit.device import resolve_device, resolve_dtype
    if report_only and config['dtype'] != 'auto':
        return config['dtype']
    try:
        device = resolve_device(config['device'])
    except RunError:
        if not report_only:
            raise
        return 'bfloat16' if config['device'].startswith('cuda') else 'float32'
    return resolve_dtype(config['dtype'], device)


def train_dir(args, name):
    return os.path.join(args.out_dir, 'train', name)


def recipe_of(config, per_step):
    """What every run of one study shares (its arm adds no_decay): records of another recipe are never mixed in."""
    return {key: config[key] for key in RECIPE_KEYS} | dict(tokens=config['max_iters'] * per_step)


def state(run, records, per_step, study):
    """recorded (its record may stand for it: study_records.reuse_problems), or train.py's state of its run: done /
    partial / new / changed (training.planned_run, the rule the quick start applies too: the same settings continue,
    changed ones train again from scratch). A record that may not stand is said, with why, before any work."""
    from lmkit import resume
    from lmkit.training import planned_run
    record = records.get(run['name'])
    if record:
        problems = study_records.reuse_problems(record, run['config'], run['teacher'],
                                                recipe_of(run['config'], per_step), study['corpus'], study['overrides'])
        if not problems:
            return 'recorded'
        print(f"{run['name']}: its record was made with other settings ({'; '.join(problems)}): trained again",
              flush=True)
    c, step, changed = planned_run(with_root(run['argv']), cwd=HERE)
    run['extra'], run['note'] = (resume.RESTART, resume.restart_note(c['out_dir'], changed)) if changed else ([], '')
    return 'new' if step is None else 'changed' if changed else 'done' if step >= c['max_iters'] else 'partial'

# -----------------------------------------------------------------------------
# Running: --jobs train.py processes at once, progress and an ETA on the console; a record per finished run


def last_logged(out_dir):
    """(the last step metrics.jsonl records, whether that step's loss is finite); (0, True) without one. Read from
    the end in growing blocks: an evaluation's line (every head's measures) can be longer than any fixed tail."""
    path = os.path.join(HERE, out_dir, 'metrics.jsonl')
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


def last_step(out_dir):
    return last_logged(out_dir)[0]


def priority(run, runs):
    """The order runs start in: teachers, then the kd arm (the paper's setting), ce, the control, the extra variants
    and the recipe's seed, each by seed: a study stopped part way has the most useful runs."""
    teacher = any(r['teacher'] == run['name'] for r in runs)
    arm = dict(kd=1, ce=2, control=3, recipe=5).get(run['arm'], 0)
    return (0 if teacher else arm + 3 * (run['variant'] in EXTRA), run['seed'])


class Stopped(RunError):
    """SIGTERM or SIGINT (Ctrl-C) reached the study."""


def raise_stopped(signum, frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


def last_line(path):
    """The last non-empty line of a run's log (what a failed child said last)."""
    try:
        with open(path, errors='replace') as f:
            lines = [line.strip() for line in f.read()[-8192:].splitlines() if line.strip()]
    except OSError:
        return ''
    return lines[-1] if lines else ''


def launch(run, logs, env):
    """Start one run's train.py in a session of its own (a Ctrl-C at the terminal reaches the study alone, which
    stops its children itself), after writing when and at which commit it started (its record holds both)."""
    command = [sys.executable, 'train.py', *run['argv'], *run['extra']]
    if run['note']:
        print(run['note'], flush=True)
    print(f"$ {shlex.join(command)}  > {logs}/{run['name']}.log", flush=True)
    seal = dict(seal=run['seal']) if run.get('seal') else {}
    write_json(os.path.join(logs, f"{run['name']}.start.json"), dict(started=now(), **code_version(), **seal))
    log = open(os.path.join(logs, f"{run['name']}.log"), 'a')
    proc = subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, run, log


def stop_children(running, logs, why):
    """SIGTERM to every running train.py (each saves its checkpoint at the end of its step, then exits), a wait for
    them, SIGKILL for any still there after STOP_WAIT seconds; then the one-line error."""
    for proc, _, _ in running.values():
        proc.send_signal(signal.SIGTERM)
    deadline = time.time() + STOP_WAIT
    for name, (proc, _, log) in running.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    names = ', '.join(running) or 'none'
    return f"{why}; runs stopped (each saved its last step): {names}; run the same command again to continue"


STOP_WAIT = 120  # seconds a child may take to finish its step and save before it is killed


def run_all(runs, steps, jobs, threads, logs, finished):
    """Train every run whose state is not recorded or done, `jobs` at a time (a student once its teacher is done) in
    priority's order, printing progress; finished(run) (its end measures and record) for each run whose training has
    ended, one per pass, after the free slots are filled, so the device trains while a record is made. A failed
    child, or SIGTERM / SIGINT to the study, stops every child cleanly first."""
    todo = sorted((r for r in runs if r['state'] not in ('recorded', 'done')), key=lambda r: priority(r, runs))
    done_names = {r['name'] for r in runs if r['state'] in ('recorded', 'done')}
    unrecorded = [r for r in runs if r['state'] == 'done']
    running, t0, last_print = {}, time.time(), 0
    start_steps = {r['name']: last_step(r['config']['out_dir']) for r in todo}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    try:
        while todo or running or unrecorded:
            for name, (proc, run, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    del running[name]
                    if proc.returncode != 0:
                        raise RunError(f"run {name} failed (exit code {proc.returncode}): "
                                       f"{last_line(os.path.join(logs, name + '.log'))!r} (its log: {logs}/{name}.log);"
                                       f" fix it and run the same command again (finished runs are skipped)")
                    done_names.add(name)
                    unrecorded.append(run)  # recorded below, once the free slots have runs again
                    print(f"finished {name} ({len(done_names)}/{len(runs)} runs)", flush=True)
            ready = [r for r in todo if r['teacher'] is None or r['teacher'] in done_names]
            while ready and len(running) < jobs:
                run = ready.pop(0)
                todo.remove(run)
                running[run['name']] = launch(run, logs, env)
            if not running and todo:
                raise RunError(f"{todo[0]['name']} waits for its teacher {todo[0]['teacher']}, which is not planned")
            if unrecorded:
                finished(unrecorded.pop(0))
                continue
            if time.time() - last_print >= 30 or not running:
                last_print = time.time()
                progress(runs, running, steps, start_steps, t0)
            time.sleep(1)
    except RunError as e:
        if running:
            raise type(e)(stop_children(running, logs, str(e))) from None
        raise


def progress(runs, running, steps, start_steps, t0):
    """One console line: runs finished, each running run's step and whether its loss is finite (never a value: a
    blind study's console shows no measure before its last run ends), and an ETA from the steps done since the
    start."""
    now = {r['name']: steps if r['state'] == 'recorded' else last_step(r['config']['out_dir']) for r in runs}
    left = sum(steps - now[r['name']] for r in runs)
    done_here = sum(now[n] - s for n, s in start_steps.items())
    elapsed = time.time() - t0
    eta = f"ETA {minutes(left * elapsed / done_here)}" if done_here > 0 and left else "ETA -"
    finite = {name: last_logged(run['config']['out_dir'])[1] for name, (_, run, _) in running.items()}
    parts = ', '.join(f"{name} {now[name]}/{steps}{'' if finite[name] else ' (loss not finite)'}" for name in running)
    finished = sum(now[r['name']] >= steps for r in runs)
    print(f"[{minutes(elapsed)}] {finished}/{len(runs)} runs done | {parts or 'none running'} | {eta}", flush=True)


# A run's record: its last evaluation's measures, its curve, its spikes and KD loss, and the end-of-run measures


def end_measures(out_dir, data_dir, device):
    """What the study measures on a finished run's checkpoint (probes.py; analyze.py attention measures the same
    on any model): Gu et al.'s Sink_1 in their setting (GU_SAMPLES validation windows of GU_LENGTH tokens, starting
    with the run's first token), W8A8 (ranges from CALIBRATION windows after the END_WINDOWS it evaluates), the
    knockout (window: a quarter of the context) on END_WINDOWS windows, Figure 3's spread: the standard deviation
    of the per-query row totals (each query i >= 1's sum_j w_ij, averaged over heads) over the attention windows,
    per layer, and the payoff's candidates (payoff_measures). On the run's device: a GPU plan's records are made in
    seconds while its next runs train."""
    import torch
    from lmkit.data import Windows, first_token_id, read_meta
    from model import GPT
    from lmkit.probes import attention_statistics, knockout_losses, sink_rates, w8a8_losses
    model = GPT.from_pretrained(os.path.join(HERE, out_dir)).to(device).eval()
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
    layers = attention_statistics(model, windows(T, range(config['attention_windows'] or 8)).to(device))
    spread = [layer['row_sums'][:, 1:].std().item() for layer in layers]
    return dict(gu=gu, w8a8=w8a8, knockout=knockout, row_total_std=spread,
                payoff=payoff_measures(model, calibration, sequences))


def payoff_measures(model, calibration, sequences):
    """end.payoff: what a sink-free attention should pay off, in measures that can leave their floor at this scale,
    where W8A8's ratio stayed within 0.9988-1.0022 for every variant (v2): the loss at the coarser widths of
    PAYOFF_BITS (w8a6, ...) and its ratio over full precision (ratio_w8a6, ...), on W8A8's windows and ranges; and
    Bondarenko et al.'s outliers per layer on the same windows (PAYOFF_OUTLIERS: the FFN output's max |x| and
    kurtosis, the attention output's, the residual stream's max |x|; each also without position 0), averaged over
    the windows (probes.outlier_means)."""
    from lmkit.probes import outlier_means, quantized_losses
    payoff = {}
    for weight_bits, act_bits in PAYOFF_BITS:
        q = quantized_losses(model, calibration, sequences, weight_bits, act_bits, batch_size=16)
        payoff |= {f'w{weight_bits}a{act_bits}': q['quantized'], f'ratio_w{weight_bits}a{act_bits}': q['ratio']}
    outliers = outlier_means(model, sequences, batch_size=16)
    return payoff | {key: outliers[key] for key in PAYOFF_OUTLIERS}


def timed_end_measures(out_dir, data_dir, device):
    """end_measures on the run's device and one thread (the runs still training have the cores), the caller's thread
    count restored."""
    import torch
    from lmkit.device import resolve_device
    t0, threads = time.time(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        end = end_measures(out_dir, data_dir, resolve_device(device))
    finally:
        torch.set_num_threads(threads)
    return dict(end=end, end_seconds=round(time.time() - t0, 1))


# what train.py logs at every step (its evaluations add the rest)
STEP_KEYS = ('step', 'lr', 'loss', 'grad_norm', 'tokens_per_sec', 'mfu', 'dt', 'peak_memory_gib', 'kd_loss', 'ce_loss',
             'teacher_sec', 'skipped_steps')


def make_record(run, per_step, data_dir, logs):
    """The record of a finished run (report_dir/runs/<name>.json; docs/analysis.md documents it)."""
    from lmkit.runs import load_run, spike_counts
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
        **spikes_after_warmup(grad, run['config']['warmup_iters']),
        **timed_end_measures(run['config']['out_dir'], data_dir, run['config']['device']), curve=curve,
        ckpt=os.path.join(run['config']['out_dir'], 'ckpt.pt'), **provenance(run, data_dir, logs))


def spikes_after_warmup(grad, warmup):
    """Table 5's counts over steps warmup-500 only (None where the warm-up reaches step 500): the warm-up's own
    spikes (most of a short run's) left out, the median and MAD over that window."""
    from lmkit.runs import spike_counts
    end = min(SPIKE_WINDOW[1], len(grad))
    counts = {str(k): n for k, n in spike_counts(grad, SPIKE_KS, warmup, end).items()} if warmup < end else None
    return dict(spikes_after_warmup=counts, spikes_after_warmup_window=[min(warmup, end), end])


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


def code_version():
    """{commit, dirty} of this checkout (None where git cannot tell): what a run started at."""
    def git(*args):
        out = subprocess.run(['git', *args], cwd=HERE, capture_output=True, text=True)
        if out.returncode != 0:
            raise OSError(out.stderr)
        return out.stdout.strip()
    try:
        return dict(commit=git('rev-parse', 'HEAD'), dirty=bool(git('status', '--porcelain', '--untracked-files=no')))
    except OSError:
        return dict(commit=None, dirty=None)


def corpus_identity(data_dir):
    """What identifies the prepared corpus: its shards' checksums (prepare_data.py's meta.json) and tokenizer."""
    from lmkit.data import read_meta
    meta = read_meta(os.path.join(HERE, data_dir))
    return dict(checksums=meta['checksums'], tokenizer_sha256=meta['tokenizer'].get('sha256'),
                source=meta['settings']['source']['source'])


def provenance(run, data_dir, logs):
    """What produced a record: every train.py setting of the run (its config.json), the corpus, the commit the run
    started at and whether the tree was dirty (launch's start file; None where the run was trained elsewhere), its
    start and end times."""
    with open(os.path.join(HERE, run['config']['out_dir'], 'config.json')) as f:
        settings = json.load(f)
    start = dict(started=None, commit=None, dirty=None)
    path = os.path.join(logs, f"{run['name']}.start.json")
    if os.path.isfile(path):
        with open(path) as f:
            start |= json.load(f)
    return dict(settings=settings, corpus=corpus_identity(data_dir), **start, finished=now())


def check_seal(args):
    """The commit a blind study is sealed at (docs/analysis.md, "The seal"), which each of its records stores:
    report_dir/seal.json names it and every file it held outside docs/, and a file here that differs stops the study
    before any work. None for a study that is not blind."""
    if args.claims not in BLIND:
        return None
    seal = study_records.read_seal(os.path.join(HERE, args.report_dir))
    if seal is None:
        raise RunError(f"the {args.claims} claims are tested only by a sealed study, and {args.report_dir}/{SEAL_FILE} "
                       f"is not there (scripts/seal_study.py writes it; docs/analysis.md, 'The seal')")
    changed = study_records.unsealed_files(seal, HERE)
    if changed:
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ''
        raise RunError(f"{len(changed)} file(s) differ from the seal {seal['commit'][:12]} ({', '.join(changed[:5])}"
                       f"{more}): train the sealed study from a checkout of the commit that added its seal: git "
                       f"worktree add ../sealed $(git log -1 --format=%H -- {args.report_dir}/{SEAL_FILE})")
    return seal['commit']


def read_records(report_dir):
    """{name: record} of report_dir/runs, every file validated (study_records.read_records)."""
    return study_records.read_records(os.path.join(HERE, report_dir, 'runs'))


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


def unusable(runs, records, per_step, study, planned_only=False):
    """{name: why} of the records in runs/ that this command's report would leave out: not planned, or (unless
    planned_only) made with other settings (study_records.reuse_problems)."""
    plan = {r['name']: r for r in runs}
    out = {}
    for name, record in records.items():
        run = plan.get(name)
        if run is None:
            out[name] = 'not planned by this command'
        elif not planned_only:
            problems = study_records.reuse_problems(record, run['config'], run['teacher'],
                                                    recipe_of(run['config'], per_step), study['corpus'],
                                                    study['overrides'])
            if problems:
                out[name] = 'other settings: ' + '; '.join(problems)
    return out


def refuse_unusable(args, left_out):
    """Nothing in runs/ is left out in silence: without --subset, records this command would not report stop it."""
    if left_out and not args.subset:
        listed = ', '.join(f"{name} ({why})" for name, why in sorted(left_out.items())[:6])
        more = f" and {len(left_out) - 6} more" if len(left_out) > 6 else ''
        raise RunError(f"{args.report_dir}/runs holds {len(left_out)} record(s) this command would leave out of its "
                       f"report: {listed}{more}; give the settings and seeds they were made with, or --subset=True "
                       f"to report on this command's runs alone (the report lists the others)")


def trained_on(records):
    """The machines that trained the records, with how many each."""
    counts = collections.Counter(r['machine'] for r in records)
    return '; '.join(f"{machine} ({n} run{'s' if n > 1 else ''})" for machine, n in sorted(counts.items()))


def collect(args, runs, per_step, command, study, records):
    """results.json (schema 2, docs/analysis.md): every record of report_dir/runs (records) this command plans, made
    with its settings (others stop it unless --subset), the claims' tests, and what the report and README need."""
    from lmkit.data import read_meta
    meta = read_meta(os.path.join(HERE, args.data_dir))
    config = next(r['config'] for r in runs if r['arm'] != 'teacher')  # the students' recipe
    source = meta['settings']['source']
    recipe = recipe_of(config, per_step)
    left_out = unusable(runs, records, per_step, study)
    refuse_unusable(args, left_out)
    planned = {r['name'] for r in runs if r['arm'] != 'teacher'}
    kept = [r for name, r in records.items() if name not in left_out]
    missing = sorted(planned - {r['name'] for r in kept})
    order = {(a, v): i for i, (a, v) in enumerate((a, v) for a in ARMS for v in list(ATTENTIONS))}
    kept.sort(key=lambda r: (order.get((r['arm'], r['variant']), 0), r['seed']))
    results = dict(
        schema_version=SCHEMA_VERSION, command=command, report_dir=args.report_dir,
        machine=trained_on(kept) if kept else 'no runs yet',
        corpus=dict(source=source['source'], python=source.get('python'), **source.get('corpus', {}),
                    data_dir=args.data_dir),
        bos_id=meta['tokenizer']['bos_id'] if meta['tokenizer']['bos_id'] is not None else meta['tokenizer']['eos_id'],
        context=config['block_size'], layers=config['n_layer'], recipe=recipe,
        recipe_text=', '.join(f"{k}={v}" for k, v in recipe.items()),
        teachers=[teacher_of(s, args) for s in range(1, len(args.teachers) + 1)],
        uniform_first_token=uniform_first_token(config['block_size']),
        arms=[a for a in ('kd', 'ce', 'control', 'recipe', 'teacher') if any(r['arm'] == a for r in kept)],
        excluded=sorted(left_out), missing=missing, runs=[summary(r) for r in kept])
    results['claims'] = test_claims(kept, args.claims)
    if args.claims != 'v1':  # (v1's results.json predates the key)
        results['claim_set'] = args.claims
    results['reading'] = study_reading.reading(results)  # what the records say beyond the claims (exploratory)
    return results


def study_threads(args):
    """Threads per run: the user's OMP_NUM_THREADS where set (said), else the cores shared among the jobs."""
    if args.device != 'cpu':
        return 1, ''
    user = os.environ.get('OMP_NUM_THREADS', '')
    if user:
        if not user.isdigit() or int(user) < 1:
            raise RunError(f"OMP_NUM_THREADS={user!r} is not a positive whole number: unset it or give one")
        return int(user), ' (OMP_NUM_THREADS from the environment)'
    return max(1, (os.cpu_count() or 1) // args.jobs), ''


def parse_args(argv):
    """(the study's settings as attributes, the train.py overrides) of a command line."""
    keys = study_keys(tuple(ATTENTIONS))
    mine, overrides = split_argv(argv, keys)
    args = type('Args', (), parse(mine, keys, __doc__.split('\n\n')[1], prog='python -m study.sink_study'))
    args.report_dir = args.report_dir or args.out_dir
    for flag in ('config', 'teacher_config'):
        missing = [path for path in getattr(args, flag) if not os.path.isfile(os.path.join(HERE, path))]
        if missing:
            raise RunError(f"--{flag}={','.join(getattr(args, flag))}: no such file: {', '.join(missing)}")
    return args, overrides


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    for path, writes in ((args.out_dir, ['train', 'logs']), (args.report_dir, ['results.json', 'report.md'])):
        claim_dir(os.path.join(HERE, path), 'study/sink_study.py', writes=writes,
                  ours=lambda names: bool({'train', 'runs', 'results.json'} & names))
    if args.jobs == 0:
        args.jobs = os.cpu_count() or 1 if args.device == 'cpu' else GPU_JOBS
    threads, threads_from = study_threads(args)
    runs, steps, per_step = plan_runs(args, overrides)
    # the command that trains these runs (--report_only only rewrites the report from their records)
    command = shlex.join(['python', '-m', 'study.sink_study', *(a for a in argv if not a.startswith('--report_only'))])
    t0 = time.time()
    previous = {s: signal.signal(s, raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if not args.report_only:
            prepare_corpus(args)
        study = dict(corpus=corpus_identity(args.data_dir), overrides=[a[2:].partition('=')[0] for a in overrides])
        if not args.report_only:
            train_all(args, runs, steps, per_step, study, threads, threads_from)
        records = read_records(args.report_dir)  # as training left them
        waiting = sorted({r['name'] for r in runs} - set(records)) if args.claims in BLIND else []
        if waiting:
            print(f"{len(runs) - len(waiting)} of {len(runs)} runs recorded ({len(waiting)} to go); the {args.claims} "
                  f"study's report is written once, after its last run: no measure of its runs is read before",
                  flush=True)
            return None
        results = collect(args, runs, per_step, command, study, records)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    out = os.path.join(HERE, args.report_dir)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, 'results.json'), results, allow_nan=False)
    figures(results, out)
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write('\n'.join(report_lines(results)) + '\n')
    print(f"wrote {args.report_dir}/report.md and results.json ({len(results['runs'])} records) in "
          f"{minutes(time.time() - t0)}")
    return results


def train_all(args, runs, steps, per_step, study, threads, threads_from):
    """Every planned run without a record that may stand for it, trained; a record written as each finishes."""
    seal = check_seal(args)
    records = read_records(args.report_dir)
    refuse_unusable(args, unusable(runs, records, per_step, study, planned_only=True))
    for run in runs:
        run['state'], run['seal'] = state(run, records, per_step, study), seal
    for run in runs:  # a teacher with a record but no checkpoint trains again where a student needs it
        students = [r for r in runs if r['teacher'] == run['name'] and r['state'] != 'recorded']
        if run['state'] == 'recorded' and students and not os.path.isfile(
                os.path.join(HERE, run['config']['out_dir'], 'ckpt.pt')):
            run['state'] = state(run, {}, per_step, study)
    todo = [r for r in runs if r['state'] not in ('recorded', 'done')]
    print(f"{len(runs)} runs of {steps:,} steps ({steps * per_step:,} tokens) each, {len(runs) - len(todo)} done "
          f"already; {args.jobs} at a time, {threads} thread(s) each{threads_from}", flush=True)
    logs = os.path.join(HERE, args.out_dir, 'logs')
    os.makedirs(logs, exist_ok=True)
    os.makedirs(os.path.join(HERE, args.report_dir, 'runs'), exist_ok=True)

    def finished(run):
        path = os.path.join(HERE, args.report_dir, 'runs', f"{run['name']}.json")
        if run['arm'] != 'teacher' or not os.path.isfile(path):
            record = make_record(run, per_step, args.data_dir, logs)
            record['arm'] = run.get('record_arm', run['arm'])
            try:
                record['digest'] = study_records.digest(record)  # a ValueError on a NaN (strict JSON)
                study_records.validate(record)
            except (study_records.Invalid, ValueError) as e:
                raise RunError(f"{run['name']}: finished, but its measures make no valid record ({e}); see "
                               f"{logs}/{run['name']}.log") from None
            write_json(path, record, indent=None, allow_nan=False)
    run_all(runs, steps, args.jobs, threads, logs, finished)


if __name__ == '__main__':
    run_script(main)
