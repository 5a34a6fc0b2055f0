"""The sink study (docs/analysis.md, "The sink study"): does softmax attention, trained by this
repo, grow a first-token sink, and do the paper's claims about each variant hold where it does?
This file plans, runs and records; study/study_results.py turns records into verdicts and words.

    python -m study.sink_study                               # the pilot -> out/sink_study/report.md
    python -m study.sink_study --plan=v2 --report_dir=docs/sink_study_v2  # v2, sealed
    python -m study.sink_study --plan=v3_gpu --dry_run=True  # memory plans and schedule (ESTIMATE)
    python -m study.sink_study --plan=v3_gpu --report_dir=docs/sink_study_v3_gpu \\
        --mirror_dir=$OUT/v3_gpu                             # on a lent GPU
"""
import collections
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m study.sink_study")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from study import study_reading, study_records
from configurator import Key, parse
from lmkit import children
from lmkit.errors import (STOP_STATUSES, RunError, Stopped, describe_os_error, on_stop_signals,
                          run_script, stop_name)
from lmkit.files import atomic_write, claim_dir, write_json
from model import ATTENTIONS
from lmkit.probes import SINK_STUDY_EVALUATIONS as EVALUATIONS
from lmkit.sink_costs import GU_LENGTH, GU_SAMPLES
from lmkit.children import last_logged
from study.study_records import (ARMS, NO_DECAY, PAYOFF_BITS, PAYOFF_OUTLIERS, RECIPE_KEYS,
                                 SCHEMA_VERSION, SEAL_FILE, SPIKE_KS, record_name)
from study.study_results import (AFFINE, CLAIM_SETS, CORE, CUSTOM, DECAY, EXTRA, GATED, HEADWISE,
                                 KD_ARMS, RECIPE_SEED, SEALED_SETS, SINK, SOFTMAX, figures, minutes,
                                 report_lines, test_claims, uniform_first_token)

FINAL_KD_STEPS = 50  # a kd run's final KD loss: the mean of its last 50 steps' kd_loss
SPIKE_WINDOW = (0, 500)  # Table 5: median + k MAD over steps 0-500 (a shorter run: all its steps)
# validation windows of W8A8 and the knockout; W8A8's calibration windows after them
END_WINDOWS, CALIBRATION = 32, 4
# end.heldout's validation windows: at the studies' 128 tokens, 32x the 16,384 tokens of v3's
# val_loss (8 batches of 16), so that it resolves differences v3's could not (docs/analysis.md, v4)
HELDOUT_WINDOWS = 4096

# claim sets whose report waits for the last run (issue 44: no tested measure is read before it)
BLIND = SEALED_SETS
# runs side by side on one GPU: attempt_1 (docs/sink_study_gpu/) ran each at 337k-421k tokens/s on
# an H200
GPU_JOBS = 4

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
CONFIG = 'config/sink_study.py'
PLANS = {  # what --plan sets (each key may still be given after it)
    'pilot': dict(variants=CORE, arms=['ce', 'kd'], seeds=[1, 2, 3], kd_seeds=[1, 2, 3]),
    'full': dict(variants=CORE + EXTRA, arms=['recipe', 'ce', 'kd', 'control'],
                 seeds=[1, 2, 3, 4, 5, 6],
                 kd_seeds=list(range(1, 9)), extra_seeds=[1, 2, 3], control_seeds=[1, 2, 3, 4, 5]),
    # v2 (docs/sink_study_v2/): matched pairs distilled from larger teachers of other seeds; sealed
    # (docs/analysis.md)
    'v2': dict(variants=CORE, arms=['kd'], kd_seeds=list(range(1, 13)), teachers=[101, 102],
               config=[CONFIG, 'config/sink_study_v2.py'],
               teacher_config=['config/sink_study_v2_teacher.py'], claims='v2'),
    # v2's design, larger, on one GPU (config/sink_study_gpu.py; its first attempt:
    # docs/sink_study_gpu/attempt_1/)
    'gpu': dict(variants=CORE, arms=['kd'], kd_seeds=[1, 2, 3], teachers=[101], tokens=12_000_000,
                device='cuda',
                out_dir='out/sink_study_gpu',
                config=[CONFIG, 'config/sink_study_v2.py', 'config/sink_study_gpu.py'],
                teacher_config=['config/sink_study_gpu_teacher.py'], claims='v2'),
    # v3 (issue 50; sealed, docs/analysis.md): every claim v1 or v2 tested, on seeds no plan, search
    # or attempt has used, distilled from four teachers; v2's recipe and shapes (4x128, byte tokens)
    # on the CPU
    'v3': dict(variants=CORE, arms=['kd'], kd_seeds=list(range(201, 213)),
               teachers=[301, 302, 303, 304],
               out_dir='out/sink_study_v3', config=[CONFIG, 'config/sink_study_v2.py'],
               teacher_config=['config/sink_study_v2_teacher.py'], claims='v3'),
    # v3 on one GPU, at the GPU plan's shapes (8x256), where softmax grew sinks in more layers (its
    # first attempt); 5M tokens a run, so that its 39 runs fit one command of about 8 minutes (its
    # --dry_run's ESTIMATE)
    'v3_gpu': dict(variants=CORE, arms=['kd'], kd_seeds=list(range(401, 410)),
                   teachers=[501, 502, 503],
                   tokens=5_000_000, device='cuda', out_dir='out/sink_study_v3_gpu',
                   config=[CONFIG, 'config/sink_study_v2.py', 'config/sink_study_gpu.py'],
                   teacher_config=['config/sink_study_gpu_teacher.py'], claims='v3_gpu'),
    # v3's pilot: which payoff measure (end.payoff) can leave its floor at this scale, chosen on
    # softmax students alone (v2's recipe and teacher shape, seeds no study has) before v3's claims
    # are fixed; not blind, no claim tested
    'v3_pilot': dict(variants=[SOFTMAX], arms=['kd'], kd_seeds=[901, 902, 903], teachers=[900],
                     out_dir='out/sink_study_v3_pilot', config=[CONFIG, 'config/sink_study_v2.py'],
                     teacher_config=['config/sink_study_v2_teacher.py'], claims='v1'),
    # v4 (issue 60; sealed, docs/analysis.md): affine against the head-wise gate of its size, and
    # Figure 4 under v1's decay rule (the decay arm: affine; sink has no matrix of its own, so both
    # rules train it alike), on 12 fresh seeds under 6 teachers (2 students each); v3's recipe
    'v4': dict(variants=[SOFTMAX, SINK, GATED, AFFINE, HEADWISE], arms=['kd', DECAY],
               decay_variants=[AFFINE], kd_seeds=list(range(601, 613)),
               teachers=list(range(701, 707)), out_dir='out/sink_study_v4',
               config=[CONFIG, 'config/sink_study_v2.py'],
               teacher_config=['config/sink_study_v2_teacher.py'], claims='v4'),
    # your own variant (docs/analysis.md, "Your own variant in the study"): v3's recipe and
    # teachers' shape, two-sided comparisons on the field's measures between --variants, the first
    # the baseline; give --variants, --kd_seeds and --teachers
    'custom': dict(variants=[SOFTMAX, AFFINE], arms=['kd'], kd_seeds=[1, 2, 3], teachers=[11],
                   out_dir='out/sink_study_custom', config=[CONFIG, 'config/sink_study_v2.py'],
                   teacher_config=['config/sink_study_v2_teacher.py'], claims=CUSTOM),
}
DECAY_CONFIG = 'config/sink_study_decay.py'  # the decay arm's rule, layered on the recipe
def study_keys(variants):
    return dict(
        plan=Key('pilot', "a study's settings by name (PLANS; docs/analysis.md, The sink study)",
                 choices=tuple(PLANS), expands=PLANS),
        out_dir=Key('out/sink_study', "where the train.py runs (train/) and their logs (logs/) go"),
        report_dir=Key('', "where the records (runs/), results.json, report.md and the figures go "
                           "(default: out_dir)"),
        data_dir=Key('data/stdlib_bytes',
                     "the prepared corpus (made here first if missing: prepare_data.py "
                     "--source=stdlib --tokenizer=bytes)"),
        variants=Key(list(PLANS['pilot']['variants']),
                     "comma-separated attention variants (model.py's registry)", choices=variants),
        arms=Key(list(PLANS['pilot']['arms']), "recipe, ce, kd, control, decay (docs/analysis.md)",
                 choices=tuple(a for a in ARMS if a != 'teacher')),  # with --teacher_config
        seeds=Key([1, 2, 3], "the ce arm's seeds of the core variants (softmax, sink, gated, "
                             "affine)", min=0),
        kd_seeds=Key([1, 2, 3], "the kd arm's student seeds of the core variants", min=0),
        extra_seeds=Key([1, 2, 3], "the ce and kd seeds of affine_gated and softmax1 (when in "
                                   "--variants)", min=0),
        control_seeds=Key([1, 2, 3, 4, 5],
                          "the control arm's seeds (affine and gated, kd, no decay on alpha_proj, "
                          "g_proj)", min=0),
        decay_variants=Key([AFFINE], "the decay arm's variants: kd, the kd seeds, decay on their "
                                     "own projections (v1's rule)", choices=variants),
        teachers=Key([1, 2], "the softmax teachers' seeds (student s distils from the ((s - 1) mod "
                             "count)-th)",
                     min=0),
        tokens=Key(3_000_000, "training tokens per run", min=1),
        device=Key('cpu', "cpu, cuda, cuda:1, ... (every run on it)"),
        jobs=Key(0, "runs at once (0: one per CPU core on cpu; on a GPU, GPU_JOBS side by "
                    "side)", min=0),
        config=Key([CONFIG], "the recipe: the train.py config files every run starts from, in "
                             "order"),
        teacher_config=Key([], "config files the kd teachers add to the recipe (none: the ce arm's "
                               "softmax runs)"),
        report_only=Key(False, "write results.json and report.md from the records there are, train "
                               "nothing"),
        claims=Key('v1', "the claims tested (study_results.CLAIM_SETS): v1's, in the kd and ce "
                         "arms; v2's, v3's, v3_gpu's and v4's, in the kd arm; custom: two-sided, "
                         "between --variants", choices=(*CLAIM_SETS, CUSTOM)),
        subset=Key(False, "report on the planned records though runs/ holds others (else they stop "
                          "the study)"),
        mirror_dir=Key('', "a folder that leaves a lent machine ($OUT): records, state and "
                           "teachers copied there (docs/analysis.md)"),
        dry_run=Key(False, "train and write nothing: each run shape's memory plan and the schedule "
                           "(ESTIMATE)"),
    )

# -----------------------------------------------------------------------------
# The plan: which train.py runs, with which arguments


def split_argv(argv, own):
    """(the study's own arguments, train.py overrides): any --key=value whose key is not the study's
    goes to every run's train.py (checked there, before any run starts)."""
    mine, theirs = [], []
    for arg in argv:
        name = arg[2:].partition('=')[0] if arg.startswith('--') else None
        (theirs if name and name not in own and arg not in ('--help',) else mine).append(arg)
    return mine, theirs


def teacher_of(seed, args):
    """The teacher of kd student `seed`: the ((seed - 1) mod count)-th of --teachers, a ce run of
    the recipe (v1) or a run of its own shape (--teacher_config: arm teacher)."""
    arm = 'teacher' if args.teacher_config else 'ce'
    return record_name(arm, SOFTMAX, args.teachers[(seed - 1) % len(args.teachers)])


def with_root(argv):
    """A train.py argv with its config files (the bare arguments) under this repository, wherever it
    runs from."""
    return [a if a.startswith('--') else os.path.join(HERE, a) for a in argv]


def run_matrix(args):
    """[(arm, variant, seed)] the arguments ask for, the ce arm (where the teachers are) first."""
    out = []
    for arm, core in (('ce', args.seeds), ('kd', args.kd_seeds)):
        if arm in args.arms:  # v1's extra variants had seeds of their own
            out += [(arm, v, s) for v in args.variants
                    for s in (core if v in CORE or args.claims != 'v1' else args.extra_seeds)]
    if DECAY in args.arms:
        out += [(DECAY, v, s) for v in args.decay_variants for s in args.kd_seeds]
    if 'recipe' in args.arms and SOFTMAX in args.variants and ('ce', SOFTMAX,
                                                               RECIPE_SEED) not in out:
        out.append(('recipe', SOFTMAX, RECIPE_SEED))
    if 'control' in args.arms:
        out += [('control', v, s) for v in (GATED, AFFINE) if v in args.variants
                for s in args.control_seeds]
    return out


def plan_runs(args, overrides):
    """[run dicts: name, arm, variant, seed, teacher, argv, config], teachers first (the kd and
    control arms read the ce arm's softmax runs of --teachers)."""
    from lmkit.runs import load_config, run_config
    base = run_config(load_config(with_root([*args.config, *overrides])))
    per_step = base.global_batch_size * base.block_size
    steps = max(1, round(args.tokens / per_step))
    common = [f'--data_dir={args.data_dir}', f'--device={args.device}', f'--max_iters={steps}',
              f'--eval_interval={max(1, steps // EVALUATIONS)}', *overrides]
    matrix = run_matrix(args)
    twice = sorted(n for n, k in collections.Counter(record_name(*m) for m in matrix).items()
                   if k > 1)
    if twice:
        raise RunError(f"{', '.join(twice)}: planned twice (a seed given twice?); each run has one "
                       "directory and one writer: give each seed once")
    runs = []
    for arm, variant, seed in matrix:
        name = record_name(arm, variant, seed)
        teacher = teacher_of(seed, args) if arm in KD_ARMS else None
        rule = [DECAY_CONFIG] if arm == DECAY else []  # the decay arm: v1's rule over the recipe
        argv = [*args.config, *rule, *common, f'--attention={variant}', f'--seed={seed}',
                f"--out_dir={train_dir(args, name)}"]
        argv += [f'--teacher={train_dir(args, teacher)}'] if teacher else []
        argv += [f"--no_decay={','.join(NO_DECAY)}"] if arm == 'control' else []
        runs.append(dict(name=name, arm=arm, variant=variant, seed=seed, teacher=teacher,
                         argv=argv))
    names = {r['name'] for r in runs}
    for teacher in sorted({r['teacher'] for r in runs if r['teacher']} - names):
        seed = int(teacher.rsplit('_s', 1)[1])
        runs.insert(0, dict(name=teacher, arm='teacher', variant=SOFTMAX, seed=seed, teacher=None,
                            record_arm='teacher' if args.teacher_config else 'ce',
                            argv=[*args.config, *args.teacher_config, *common,
                                  f'--attention={SOFTMAX}',
                                  f'--seed={seed}', f"--out_dir={train_dir(args, teacher)}"]))
    for run in runs:  # every run's settings checked before any work (train.py's own messages)
        config = run_config(load_config(with_root(run['argv'])))
        run['config'] = dataclasses.replace(config, dtype=planned_dtype(config.dtype, config.device,
                                                                        args.report_only
                                                                        or args.dry_run))
    return runs, steps, per_step


def planned_dtype(dtype, device_name, report_only):
    """The dtype as train.py resolves it and writes it to config.json (a record's settings). A
    report on records of a device this machine lacks (--plan=gpu's, on a CPU) takes 'auto' as it
    resolves on a bf16 GPU (an older GPU's records say float32: give --dtype=float32)."""
    from lmkit.distributed import resolve_device, resolve_dtype
    if report_only and dtype != 'auto':
        return dtype
    try:
        device = resolve_device(device_name)
    except RunError:
        if not report_only:
            raise
        return 'bfloat16' if device_name.startswith('cuda') else 'float32'
    return resolve_dtype(dtype, device)


def train_dir(args, name):
    return os.path.join(args.out_dir, 'train', name)


def recipe_of(config, per_step):
    """What every run of one study shares (its arm adds no_decay): records of another recipe are
    never mixed in."""
    return {key: getattr(config, key)
            for key in RECIPE_KEYS} | dict(tokens=config.max_iters * per_step)


def reuse_problems(run, record, per_step, study):
    """Why the record may not stand for the run (study_records.reuse_problems); [] where it may."""
    return study_records.reuse_problems(record, run['config'], run['teacher'],
                                        recipe_of(run['config'], per_step),
                                        study['corpus'], study['overrides'])


def state(run, records, per_step, study):
    """recorded (its record may stand for it: study_records.reuse_problems), or train.py's state of
    its run: done / partial / new / changed (run_records.planned_run, the rule the quick start
    applies too: the same settings continue, changed ones train again from scratch). A record
    that may not stand is said, with why, before any work."""
    from lmkit.run_records import RESTART, planned_run, restart_note
    record = records.get(run['name'])
    if record:
        problems = reuse_problems(run, record, per_step, study)
        if not problems:
            return 'recorded'
        print(f"{run['name']}: its record was made with other settings ({'; '.join(problems)}): "
              "trained again",
              flush=True)
    c, step, changed = planned_run(with_root(run['argv']), cwd=HERE)
    run['extra'], run['note'] = (RESTART, restart_note(c.out_dir, changed)) if changed else ([], '')
    return ('new' if step is None else 'changed' if changed
            else 'done' if step >= c.max_iters else 'partial')

# -----------------------------------------------------------------------------------------------
# Running: --jobs train.py processes at once, progress and an ETA on the console; a record per
# finished run


def last_step(out_dir):
    return last_logged(os.path.join(HERE, out_dir))[0]


def priority(run, runs):
    """The order runs start in: teachers, then the kd arm (the paper's setting), ce, the control,
    the extra variants and the recipe's seed, each by seed: a study stopped part way has the most
    useful runs."""
    teacher = any(r['teacher'] == run['name'] for r in runs)
    arm = dict(kd=1, decay=2, ce=2, control=3, recipe=5).get(run['arm'], 0)
    return (0 if teacher else arm + 3 * (run['variant'] in EXTRA), run['seed'])


def last_line(path):
    """The last non-empty line of a run's log (what a failed child said last)."""
    try:
        with open(path, errors='replace') as f:
            lines = [line.strip() for line in f.read()[-8192:].splitlines() if line.strip()]
    except OSError:
        return ''
    return lines[-1] if lines else ''


def launch(run, logs, env):
    """Start one run's train.py (children.start: a Ctrl-C at the terminal reaches the study alone,
    which stops its children itself), after writing when and at which commit it started (its record
    holds both)."""
    command = [sys.executable, 'train.py', *run['argv'], *run['extra']]
    if run['note']:
        print(run['note'], flush=True)
    print(f"$ {shlex.join(command)}  > {logs}/{run['name']}.log", flush=True)
    seal = dict(seal=run['seal']) if run.get('seal') else {}
    start = os.path.join(logs, f"{run['name']}.start.json")
    started = now()
    write_json(start, dict(first_started=first_start(start) or started, started=started,
                           **code_version(), **seal))
    log = open(os.path.join(logs, f"{run['name']}.log"), 'a')
    proc = children.start(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, run, log


def first_start(path):
    """When a run's first launch started (its start file's first_started, or started where an
    earlier version wrote only that); None for a new run. A resumed run keeps it."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        start = json.load(f)
    return start.get('first_started') or start.get('started')


def stop_children(running, why):
    """Every running train.py stopped (children.stop: each saves its checkpoint at the end of its
    step); then the one-line error."""
    children.stop([proc for proc, _, _ in running.values()])
    for _, _, log in running.values():
        log.close()
    names = ', '.join(running) or 'none'
    return (f"{why}; runs stopped (each saved its last step): {names}; run the same command "
            "again to continue")


def run_all(runs, steps, jobs, threads, logs, finished, observe=None):
    """Train every run whose state is not recorded or done, `jobs` at a time (a student once its
    teacher is done) in priority's order, printing progress; finished(run) (its end measures and
    record) for each run whose training has ended, one per pass, after the free slots are filled, so
    the device trains while a record is made; observe({name: run} training), if given, every pass
    (--mirror_dir's state). A failed child, a child stopped by a signal (it saves and exits 128 +
    the signal's number), or a stop signal to the study, stops every child cleanly first."""
    todo = sorted((r for r in runs if r['state'] not in ('recorded', 'done')),
                  key=lambda r: priority(r, runs))
    done_names = {r['name'] for r in runs if r['state'] in ('recorded', 'done')}
    unrecorded = [r for r in runs if r['state'] == 'done']
    running, t0, last_print = {}, time.time(), 0
    start_steps = {r['name']: last_step(r['config'].out_dir) for r in todo}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    try:
        while todo or running or unrecorded:
            for name, (proc, run, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    del running[name]
                    if proc.returncode in STOP_STATUSES:  # it saved first: a stop, not a failure
                        signum = STOP_STATUSES[proc.returncode]
                        why = f"run {name} was stopped by {stop_name(signum)}"
                        raise Stopped(why if running else f"{why} (it saved its last step); run "
                                      "the same command again to continue", signum)
                    if proc.returncode != 0:
                        raise RunError(f"run {name} failed (exit code {proc.returncode}): "
                                       f"{last_line(os.path.join(logs, name + '.log'))!r} (its "
                                       f"log: {logs}/{name}.log); fix it and run the same command "
                                       "again (finished runs are skipped)")
                    done_names.add(name)
                    unrecorded.append(run)  # recorded below, once the free slots have runs again
                    print(f"finished {name} ({len(done_names)}/{len(runs)} runs)", flush=True)
            ready = [r for r in todo if r['teacher'] is None or r['teacher'] in done_names]
            while ready and len(running) < jobs:
                run = ready.pop(0)
                todo.remove(run)
                running[run['name']] = launch(run, logs, env)
            if not running and todo:
                raise RunError(f"{todo[0]['name']} waits for its teacher {todo[0]['teacher']}, "
                               "which is not planned")
            if observe:
                observe({name: run for name, (_, run, _) in running.items()})
            if unrecorded:
                finished(unrecorded.pop(0))
                continue
            if time.time() - last_print >= 30 or not running:
                last_print = time.time()
                progress(runs, running, steps, start_steps, t0)
            time.sleep(1)
    except RunError as e:
        if running:
            raise e.again(stop_children(running, str(e))) from None
        raise


def progress(runs, running, steps, start_steps, t0):
    """One console line: runs finished, each running run's step and whether its loss is finite
    (never a value: a blind study's console shows no measure before its last run ends), and an ETA
    from the steps done since the start."""
    now = {r['name']: steps if r['state'] == 'recorded' else last_step(r['config'].out_dir)
           for r in runs}
    left = sum(steps - now[r['name']] for r in runs)
    done_here = sum(now[n] - s for n, s in start_steps.items())
    elapsed = time.time() - t0
    eta = f"ETA {minutes(left * elapsed / done_here)}" if done_here > 0 and left else "ETA -"
    finite = {name: last_logged(os.path.join(HERE, run['config'].out_dir))[1]
              for name, (_, run, _) in running.items()}
    parts = ', '.join(f"{name} "
                      f"{now[name]}/{steps}{'' if finite[name] else ' (loss not finite)'}"
                      for name in running)
    finished = sum(now[r['name']] >= steps for r in runs)
    print(f"[{minutes(elapsed)}] {finished}/{len(runs)} runs done | {parts or 'none running'} | "
          f"{eta}", flush=True)


# A run's record: its last evaluation's measures, its curve, its spikes and KD loss, and the
# end-of-run measures


def end_measures(out_dir, data_dir, device):
    """What the study measures on a finished run's checkpoint (probes.py; analyze.py attention
    measures the same on any model): Gu et al.'s Sink_1 in their setting (GU_SAMPLES validation
    windows of GU_LENGTH tokens, starting with the run's first token), W8A8 (ranges from CALIBRATION
    windows after the END_WINDOWS it evaluates), the knockout (window: a quarter of the context) on
    END_WINDOWS windows, Figure 3's spread: the standard deviation of the per-query row totals (each
    query i >= 1's sum_j w_ij, averaged over heads) over the attention windows, per layer, and the
    payoff's candidates (payoff_measures). On the run's device: a GPU plan's records are made in
    seconds while its next runs train."""
    import torch
    from lmkit.data import Windows, first_token_id, read_meta
    from lmkit.runs import run_config
    from model import GPT
    from lmkit.probes import attention_statistics
    from lmkit.sink_costs import knockout_losses, sink_rates, w8a8_losses
    model = GPT.from_pretrained(os.path.join(HERE, out_dir)).to(device).eval()
    with open(os.path.join(HERE, out_dir, 'config.json')) as f:
        config = run_config(json.load(f))
    first = first_token_id(config.first_token, read_meta(os.path.join(HERE, data_dir))['tokenizer'])
    T = config.block_size

    # (N, length) validation windows, as the run's evaluations read them
    def windows(length, indices):
        return torch.from_numpy(Windows(os.path.join(HERE, data_dir), 'val', length,
                                        first).get(indices)[0])

    gu = sink_rates(model, windows(min(GU_LENGTH, T), range(GU_SAMPLES)),
                    batch_size=GU_SAMPLES // 4)
    sequences = windows(T, range(END_WINDOWS))
    calibration = windows(T, range(END_WINDOWS, END_WINDOWS + CALIBRATION))
    w8a8 = w8a8_losses(model, calibration, sequences, batch_size=16)
    knockout = knockout_losses(model, sequences, batch_size=16)
    knockout |= {f'ratio_{k}': knockout[k] / knockout['full'] for k in list(knockout)
                 if k.startswith('first_')}
    layers = attention_statistics(model,
                                  windows(T, range(config.attention_windows or 8)).to(device))
    spread = [layer['row_sums'][:, 1:].std().item() for layer in layers]
    heldout = Windows(os.path.join(HERE, data_dir), 'val', T, first)
    return dict(gu=gu, w8a8=w8a8, knockout=knockout, row_total_std=spread,
                payoff=payoff_measures(model, calibration, sequences),
                heldout=heldout_loss(model, heldout, min(HELDOUT_WINDOWS, len(heldout))))


def heldout_loss(model, windows, count, batch_size=64):
    """end.heldout: the mean cross-entropy per target token over the first `count` validation
    windows (no run trains on them), summed in float64 batch by batch."""
    import torch
    device = next(model.parameters()).device
    total = 0.0
    with torch.no_grad():
        for start in range(0, count, batch_size):
            x, y = (torch.from_numpy(a).to(device)
                    for a in windows.get(range(start, min(count, start + batch_size))))
            total += model(x, y)[1].item() * y.numel()
    return dict(loss=total / (count * windows.block_size), windows=count,
                tokens=count * windows.block_size)


def payoff_measures(model, calibration, sequences):
    """end.payoff: what a sink-free attention should pay off, in measures that can leave their floor
    at this scale, where W8A8's ratio stayed within 0.9988-1.0022 for every variant (v2): the loss
    at the coarser widths of PAYOFF_BITS (w8a6, ...) and its ratio over full precision (ratio_w8a6,
    ...), on W8A8's windows and ranges; and Bondarenko et al.'s outliers per layer on the same
    windows (PAYOFF_OUTLIERS: the FFN output's max |x| and kurtosis, the attention output's, the
    residual stream's max |x|; each also without position 0), averaged over the windows
    (sink_costs.outlier_means)."""
    from lmkit.sink_costs import outlier_means, quantized_losses
    payoff = {}
    for weight_bits, act_bits in PAYOFF_BITS:
        q = quantized_losses(model, calibration, sequences, weight_bits, act_bits, batch_size=16)
        payoff |= {f'w{weight_bits}a{act_bits}': q['quantized'],
                   f'ratio_w{weight_bits}a{act_bits}': q['ratio']}
    outliers = outlier_means(model, sequences, batch_size=16)
    return payoff | {key: outliers[key] for key in PAYOFF_OUTLIERS}


def timed_end_measures(out_dir, data_dir, device):
    """end_measures on the run's device and one thread (the runs still training have the cores), the
    caller's thread count restored."""
    import torch
    from lmkit.distributed import resolve_device
    t0, threads = time.time(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        end = end_measures(out_dir, data_dir, resolve_device(device))
    finally:
        torch.set_num_threads(threads)
    return dict(end=end, end_seconds=round(time.time() - t0, 1))


# what train.py logs at every step (its evaluations add the rest)
STEP_KEYS = ('step', 'lr', 'loss', 'grad_norm', 'tokens_per_sec', 'mfu', 'dt', 'peak_memory_gib',
             'kd_loss', 'ce_loss', 'teacher_sec', 'skipped_steps')


def make_record(run, per_step, data_dir, logs):
    """The record of a finished run (report_dir/runs/<name>.json; docs/analysis.md documents it)."""
    from lmkit.run_records import load_run
    from lmkit.stats import spike_counts
    loaded = load_run(os.path.join(HERE, run['config'].out_dir))
    records = loaded['records']
    evals = [r for r in records if 'first_token_weight' in r]
    steps = run['config'].max_iters
    if not evals or records[-1]['step'] < steps:
        raise RunError(f"{run['config'].out_dir}: the run has not finished ({records[-1]['step']} "
                       f"of {steps} steps)")
    last = evals[-1]
    grad = [r['grad_norm'] for r in records]
    kd = [r['kd_loss'] for r in records if 'kd_loss' in r]
    # the evaluation's keys (train.evaluation_record)
    measured = [k for k in last if k not in STEP_KEYS]
    curve = [dict(tokens=r['step'] * per_step,
                  **{k: r[k] for k in measured if not k.endswith('_per_head')})
             for r in evals]
    # sink_mass: null where no null slot (schema 1)
    measures = {'sink_mass': None} | {k: last[k] for k in measured}
    recipe = recipe_of(run['config'], per_step)
    return dict(
        schema_version=SCHEMA_VERSION, name=run['name'], arm=run['arm'], variant=run['variant'],
                seed=run['seed'],
        teacher=run['teacher'], recipe=recipe, no_decay=run['config'].no_decay,
                tokens=last['step'] * per_step,
        seconds=round(sum(r['dt'] for r in records), 1),
        machine=f"{platform.platform()}, {os.cpu_count()} CPU cores, device {run['config'].device}",
        **measures, per_head=last['first_token_per_head'],
        final_kd_loss=statistics.fmean(kd[-FINAL_KD_STEPS:]) if kd else None,
        spikes={str(k): n for k,
                n in spike_counts(grad, SPIKE_KS, 0, min(SPIKE_WINDOW[1], len(grad))).items()},
        spikes_window=[0, min(SPIKE_WINDOW[1], len(grad))],
        spikes_whole_run={str(k): n for k, n in spike_counts(grad, SPIKE_KS, 0, len(grad)).items()},
        **spikes_after_warmup(grad, run['config'].warmup_iters),
        **timed_end_measures(run['config'].out_dir, data_dir, run['config'].device), curve=curve,
        ckpt=os.path.join(run['config'].out_dir, 'ckpt.pt'), **provenance(run, data_dir, logs))


def spikes_after_warmup(grad, warmup):
    """Table 5's counts over steps warmup-500 only (None where the warm-up reaches step 500): the
    warm-up's own spikes (most of a short run's) left out, the median and MAD over that window."""
    from lmkit.stats import spike_counts
    end = min(SPIKE_WINDOW[1], len(grad))
    counts = {str(k): n for k,
              n in spike_counts(grad, SPIKE_KS, warmup, end).items()} if warmup < end else None
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
        return dict(commit=git('rev-parse', 'HEAD'),
                    dirty=bool(git('status', '--porcelain', '--untracked-files=no')))
    except OSError:
        return dict(commit=None, dirty=None)


def corpus_identity(data_dir):
    """What identifies the prepared corpus: its shards' checksums (prepare_data.py's meta.json) and
    tokenizer."""
    from lmkit.data import read_meta
    meta = read_meta(os.path.join(HERE, data_dir))
    return dict(checksums=meta['checksums'], tokenizer_sha256=meta['tokenizer'].get('sha256'),
                source=meta['settings']['source']['source'])


def study_corpus(args, records, fall_back):
    """The corpus as results.json describes it: source, Python, files, bytes, sha256, data_dir, its
    identity (corpus_identity) and bos_id, from data_dir's meta.json. A report-only run without the
    corpus takes it from the report's own results.json (fall_back), where that names the corpus
    every record was made on: no corpus is needed to regenerate a report."""
    from lmkit.data import read_meta
    if fall_back and not os.path.isfile(os.path.join(HERE, args.data_dir, 'meta.json')):
        path = os.path.join(HERE, args.report_dir, 'results.json')
        described = {}
        if os.path.isfile(path):
            with open(path) as f:
                results = json.load(f)
            described = dict(results.get('corpus', {}), bos_id=results.get('bos_id'))
        # (v1's records predate the corpus in a record: any corpus stands for them, as
        # study_records.reuse_problems)
        made_on = {json.dumps(r['corpus'], sort_keys=True) for r in records.values()
                   if 'corpus' in r}
        if 'identity' not in described or not made_on <= {json.dumps(described['identity'],
                                                                     sort_keys=True)}:
            raise RunError(f"--report_only=True without the corpus ({args.data_dir}/meta.json is "
                           f"not there) needs {args.report_dir}/results.json to name the corpus of "
                           "every record in its runs/, and it does not: prepare the corpus first "
                           "(python prepare_data.py --source=stdlib --tokenizer=bytes "
                           f"--out_dir={args.data_dir} --val_every=50)")
        return described
    meta = read_meta(os.path.join(HERE, args.data_dir))
    source, tokenizer = meta['settings']['source'], meta['tokenizer']
    return dict(source=source['source'], python=source.get('python'), **source.get('corpus', {}),
                data_dir=args.data_dir, identity=corpus_identity(args.data_dir),
                bos_id=tokenizer['bos_id'] if tokenizer['bos_id'] is not None
                else tokenizer['eos_id'])


def provenance(run, data_dir, logs):
    """What produced a record: every train.py setting of the run (its config.json), the corpus, the
    commit the run started at and whether the tree was dirty (launch's start file; None where the
    run was trained elsewhere), its start and end times."""
    with open(os.path.join(HERE, run['config'].out_dir, 'config.json')) as f:
        settings = json.load(f)
    start = dict(started=None, commit=None, dirty=None)
    path = os.path.join(logs, f"{run['name']}.start.json")
    if os.path.isfile(path):
        with open(path) as f:
            start |= json.load(f)
    return dict(settings=settings, corpus=corpus_identity(data_dir), **start, finished=now())


def blind(args):
    """Whether the study is blind: a sealed claim set, or a custom plan its user sealed
    (report_dir/seal.json, study/seal_study.py)."""
    return args.claims in BLIND or (args.claims == CUSTOM and os.path.isfile(
        os.path.join(HERE, args.report_dir, SEAL_FILE)))


def check_seal(args):
    """The commit a blind study is sealed at (docs/analysis.md, "The seal"), which each of its
    records stores: report_dir/seal.json names it and every file it held outside docs/, and a file
    here that differs stops the study before any work. None for a study that is not blind."""
    if not blind(args):
        return None
    seal = study_records.read_seal(os.path.join(HERE, args.report_dir))
    if seal is None:
        raise RunError(f"the {args.claims} claims are tested only by a sealed study, and "
                       f"{args.report_dir}/{SEAL_FILE} is not there (study/seal_study.py writes "
                       "it; docs/analysis.md, 'The seal')")
    changed = study_records.unsealed_files(seal, HERE)
    if changed:
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ''
        # (v2's sealed commit predates study/: its study is the root's sink_study.py)
        study = ('python -m study.sink_study' if 'study/sink_study.py' in seal['files']
                 else 'python sink_study.py')
        raise RunError(f"{len(changed)} file(s) differ from the seal {seal['commit'][:12]} "
                       f"({', '.join(changed[:5])}{more}): train the sealed study from a checkout "
                       "of the commit that added its seal: git worktree add ../sealed $(git log -1 "
                       f"--format=%H -- {args.report_dir}/{SEAL_FILE}), then there, {study} with "
                       "the same arguments")
    return seal['commit']


def regenerating(args, runs, per_step, overridden, command):
    """The study's corpus and settings where this command has nothing to train: every planned run
    has a record that may stand for it (reuse_problems: the same settings, recipe and corpus; the
    corpus as study_corpus finds it, results.json where it is not prepared), and no mirror is to be
    checked. Then the command writes the report, as --report_only=True does, with no seal to check
    and no corpus to prepare; else None."""
    folder = os.path.join(HERE, args.report_dir, 'runs')
    names = {name[:-len('.json')]
             for name in os.listdir(folder)} if os.path.isdir(folder) else set()
    if args.mirror_dir or not {r['name'] for r in runs} <= names:
        return None
    records = read_records(args.report_dir)
    try:
        described = study_corpus(args, records, fall_back=True)
    except RunError:
        return None  # neither prepared nor named by results.json: training prepares it
    study = dict(corpus=described['identity'], corpus_described=described, command=command,
                 overrides=overridden)
    return None if any(reuse_problems(run, records[run['name']], per_step, study)
                       for run in runs) else study


def read_records(report_dir):
    """{name: record} of report_dir/runs, every file validated (study_records.read_records)."""
    return study_records.read_records(os.path.join(HERE, report_dir, 'runs'))


def prepare_corpus(args):
    """The stdlib corpus in byte tokens at data_dir, unless data_dir holds a complete
    prepare_data.py output already (whatever its source: results.json records which); an interrupted
    one is continued."""
    meta = os.path.join(HERE, args.data_dir, 'meta.json')
    if os.path.isfile(meta):
        with open(meta) as f:
            if json.load(f).get('complete'):
                return
    command = [sys.executable, 'prepare_data.py', '--source=stdlib', '--tokenizer=bytes',
               f'--out_dir={args.data_dir}', '--val_every=50']
    print(f"$ {shlex.join(command)}", flush=True)
    if subprocess.call(command, cwd=HERE) != 0:
        raise RunError("preparing the corpus failed (above): fix it and run the same command again")


# results.json's curves
CURVE_FIELDS = ('tokens', 'first_token_weight', 'first_token_share', 'sink_rate', 'val_loss')


def summary(record):
    """A record as results.json holds it: everything but the per-head lists, its curve's points cut
    to CURVE_FIELDS (the record in runs/ keeps every measure of every evaluation)."""
    return {k: v for k, v in record.items() if not k.endswith('_per_head') and k != 'curve'} | dict(
        curve=[{k: point[k] for k in CURVE_FIELDS} for point in record['curve']])


def unusable(runs, records, per_step, study, planned_only=False):
    """{name: why} of the records in runs/ that this command's report would leave out: not planned,
    or (unless planned_only) made with other settings (study_records.reuse_problems)."""
    plan = {r['name']: r for r in runs}
    out = {}
    for name, record in records.items():
        run = plan.get(name)
        if run is None:
            out[name] = 'not planned by this command'
        elif not planned_only:
            problems = reuse_problems(run, record, per_step, study)
            if problems:
                out[name] = 'other settings: ' + '; '.join(problems)
    return out


def refuse_unusable(args, left_out):
    """Nothing in runs/ is left out in silence: without --subset, records this command would not
    report stop it."""
    if left_out and not args.subset:
        listed = ', '.join(f"{name} ({why})" for name, why in sorted(left_out.items())[:6])
        more = f" and {len(left_out) - 6} more" if len(left_out) > 6 else ''
        raise RunError(f"{args.report_dir}/runs holds {len(left_out)} record(s) this command would "
                       f"leave out of its report: {listed}{more}; give the settings and seeds they "
                       "were made with, or --subset=True to report on this command's runs alone "
                       "(the report lists the others)")


def trained_on(records):
    """The machines that trained the records, with how many each."""
    counts = collections.Counter(r['machine'] for r in records)
    return '; '.join(f"{machine} ({n} "
                     f"run{'s' if n > 1 else ''})" for machine, n in sorted(counts.items()))


def collect(args, runs, per_step, command, study, records):
    """results.json (schema 2, docs/analysis.md): every record of report_dir/runs (records) this
    command plans, made with its settings (others stop it unless --subset), the claims' tests, and
    what the report and README need."""
    config = next(r['config'] for r in runs if r['arm'] != 'teacher')  # the students' recipe
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
        corpus={k: v for k, v in study['corpus_described'].items() if k != 'bos_id'},
        bos_id=study['corpus_described']['bos_id'],
        context=config.block_size, layers=config.n_layer, recipe=recipe,
        recipe_text=', '.join(f"{k}={v}" for k, v in recipe.items()),
        teachers=[teacher_of(s, args) for s in range(1, len(args.teachers) + 1)],
        uniform_first_token=uniform_first_token(config.block_size),
        arms=[a for a in ('kd', 'ce', 'control', DECAY, 'recipe', 'teacher')
              if any(r['arm'] == a for r in kept)],
        excluded=sorted(left_out), missing=missing, runs=[summary(r) for r in kept])
    results['claims'] = test_claims(kept, args.claims, args.variants)
    if args.claims != 'v1':  # (v1's results.json predates the key)
        results['claim_set'] = args.claims
    if args.claims == CUSTOM:  # its claims are its variants' (study_results.generic_claims)
        results['variants'] = args.variants
    # what the records say beyond the claims (exploratory)
    results['reading'] = study_reading.reading(results)
    return results


def study_threads(args):
    """Threads per run: the user's OMP_NUM_THREADS where set (said), else the cores shared among the
    jobs."""
    if args.device != 'cpu':
        return 1, ''
    user = os.environ.get('OMP_NUM_THREADS', '')
    if user:
        if not user.isdigit() or int(user) < 1:
            raise RunError(f"OMP_NUM_THREADS={user!r} is not a positive whole number: unset it or "
                           "give one")
        return int(user), ' (OMP_NUM_THREADS from the environment)'
    return max(1, (os.cpu_count() or 1) // args.jobs), ''


def parse_args(argv):
    """(the study's settings as attributes, the train.py overrides) of a command line."""
    keys = study_keys(tuple(ATTENTIONS))
    mine, overrides = split_argv(argv, keys)
    args = type('Args', (),
                parse(mine, keys, __doc__.split('\n\n')[1], files=True,
                      prog='python -m study.sink_study'))
    args.report_dir = args.report_dir or args.out_dir
    for flag in ('config', 'teacher_config'):
        missing = [path for path in getattr(args, flag)
                   if not os.path.isfile(os.path.join(HERE, path))]
        if missing:
            raise RunError(f"--{flag}={','.join(getattr(args, flag))}: no such file: "
                           f"{', '.join(missing)}")
    return args, overrides


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parse_args(argv)
    for path, writes in ((args.out_dir, ['train', 'logs']),
                         (args.report_dir, ['results.json', 'report.md'])):
        claim_dir(os.path.join(HERE, path), 'study/sink_study.py', writes=writes,
                  ours=lambda names: bool({'train', 'runs', 'results.json'} & names))
    if args.mirror_dir:
        claim_mirror(args)
    if args.jobs == 0:
        args.jobs = os.cpu_count() or 1 if args.device == 'cpu' else GPU_JOBS
    threads, threads_from = study_threads(args)
    runs, steps, per_step = plan_runs(args, overrides)
    if args.dry_run:
        return dry_run(args, runs, steps, per_step)
    # the command that trains these runs (--report_only only rewrites the report from their records)
    command = shlex.join(['python', '-m', 'study.sink_study',
                          *(a for a in argv if not a.startswith('--report_only'))])
    t0 = time.time()
    overridden = [a[2:].partition('=')[0] for a in overrides]
    with on_stop_signals():  # Ctrl-C or SIGTERM: the runs are stopped cleanly (run_all)
        study = None if args.report_only else regenerating(args, runs, per_step, overridden,
                                                           command)
        if study:
            print(f"every run this command plans has its record in {args.report_dir}/runs: its "
                  "report is written from them, as --report_only=True does", flush=True)
            args.report_only = True
        if not args.report_only:
            prepare_corpus(args)
        if study is None:
            described = study_corpus(args, read_records(args.report_dir), args.report_only)
            study = dict(corpus=described['identity'], corpus_described=described, command=command,
                         overrides=overridden)
        if not args.report_only:
            train_all(args, runs, steps, per_step, study, threads, threads_from)
        records = read_records(args.report_dir)  # as training left them
        waiting = sorted({r['name'] for r in runs} - set(records)) if blind(args) else []
        if waiting:
            named = ', '.join(waiting[:6]) + (f" and {len(waiting) - 6} more" if len(waiting) > 6
                                              else '')
            print(f"{len(runs) - len(waiting)} of {len(runs)} runs recorded ({len(waiting)} to go: "
                  f"{named}); the {args.claims} study's report is written once, after its last "
                  "run: no measure of its runs is read before", flush=True)
            return None
        results = collect(args, runs, per_step, command, study, records)
    out = os.path.join(HERE, args.report_dir)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, 'results.json'), results, allow_nan=False)
    figures(results, out)
    with atomic_write(os.path.join(out, 'report.md')) as f:
        f.write('\n'.join(report_lines(results)) + '\n')
    print(f"wrote {args.report_dir}/report.md and results.json ({len(results['runs'])} records) in "
          f"{minutes(time.time() - t0)}")
    return results


def same_teacher(name, recorded, trained):
    """A teacher trained again (its checkpoint lost with a machine, its record kept) must be the one
    its record describes, or its students still to train would distil from another: its held-out
    loss and first-token weights equal to the last digit, else the study stops with one line."""
    keys = ('val_loss', 'first_token_weight', 'entropy')
    differ = [k for k in keys if recorded.get(k) != trained.get(k)]
    if differ:
        raise RunError(f"{name}: trained again (its checkpoint was lost), it differs from its "
                       f"record ({differ[0]} {trained.get(differ[0])} against "
                       f"{recorded.get(differ[0])}): its students still to train would distil from "
                       "another teacher than the recorded one; train this plan's runs on one "
                       "machine, in one command, as sized (docs/analysis.md, \"A GPU plan's "
                       "folder\")")


def train_all(args, runs, steps, per_step, study, threads, threads_from):
    """Every planned run without a record that may stand for it, trained; a record written as each
    finishes."""
    seal = check_seal(args)
    mirror = Mirror(args, study['command'], seal) if args.mirror_dir else None
    if mirror:
        mirror.restore(runs)  # a fresh machine goes on from the mirror's records
    records = read_records(args.report_dir)
    refuse_unusable(args, unusable(runs, records, per_step, study, planned_only=True))
    if mirror:
        mirror.keep()
    for run in runs:
        run['state'], run['seal'] = state(run, records, per_step, study), seal
    # a teacher with a record but no checkpoint trains again where a student needs it
    for run in runs:
        students = [r for r in runs if r['teacher'] == run['name'] and r['state'] != 'recorded']
        if run['state'] == 'recorded' and students and not os.path.isfile(
                os.path.join(HERE, run['config'].out_dir, 'ckpt.pt')):
            run['state'] = state(run, {}, per_step, study)
    todo = [r for r in runs if r['state'] not in ('recorded', 'done')]
    print(f"{len(runs)} runs of {steps:,} steps ({steps * per_step:,} tokens) each, "
          f"{len(runs) - len(todo)} done already; {args.jobs} at a time, {threads} thread(s) "
          f"each{threads_from}", flush=True)
    logs = os.path.join(HERE, args.out_dir, 'logs')
    os.makedirs(logs, exist_ok=True)
    os.makedirs(os.path.join(HERE, args.report_dir, 'runs'), exist_ok=True)

    def finished(run):
        path = os.path.join(HERE, args.report_dir, 'runs', f"{run['name']}.json")
        record = make_record(run, per_step, args.data_dir, logs)
        record['arm'] = run.get('record_arm', run['arm'])
        try:
            record['digest'] = study_records.digest(record)  # a ValueError on a NaN (strict JSON)
            study_records.validate(record)
        except (study_records.Invalid, ValueError) as e:
            raise RunError(f"{run['name']}: finished, but its measures make no valid record ({e}); "
                           f"see {logs}/{run['name']}.log") from None
        if run['arm'] == 'teacher' and os.path.isfile(path):
            same_teacher(run['name'], read_records(args.report_dir)[run['name']], record)
        else:
            write_json(path, record, indent=None, allow_nan=False)
        if mirror:
            mirror.keep()
    try:
        run_all(runs, steps, args.jobs, threads, logs, finished, mirror.observe if mirror else None)
    finally:
        if mirror:
            mirror.observe({}, force=True)


# -----------------------------------------------------------------------------------------------
# --mirror_dir: a lent machine's disk goes back with it (the GPU plan's first attempt lost six
# records so); what the study has made is copied, as it is made, to a folder that leaves the
# machine, and a fresh machine goes on from it

# in the mirror: which plan and seal it mirrors, and where the study stands
MIRROR_STATE = 'state.json'
# in the mirror: every record, {name: record}, one file rewritten as each is made
MIRROR_RECORDS = 'records.json'
STATE_EVERY = 10  # seconds between state.json's writes while only the training steps change


def mirror_state(path):
    """The mirror's state.json as a dict, or None where the folder holds none that reads as one."""
    try:
        with open(os.path.join(path, MIRROR_STATE), encoding='utf-8') as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def claim_mirror(args):
    """--mirror_dir's house rule (files.claim_dir's), before any work: a new or empty folder, or a
    mirror of this same plan (its state.json says so); a folder of anyone else's files is refused,
    never written into or read as ours."""
    path = os.path.join(HERE, args.mirror_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunError(f"--mirror_dir={args.mirror_dir}: is a file, not a folder: give another "
                       "path")
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    state = mirror_state(path) if names else None
    if names and (state is None or state.get('plan') != args.plan):
        held = (f"the mirror of a --plan={state.get('plan')} study" if state else
                "files that are not a study's mirror "
                f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})")
        raise RunError(f"--mirror_dir={args.mirror_dir}: holds {held}; the study mirrors only into "
                       "a new or empty folder or its own mirror (a state.json of "
                       f"--plan={args.plan}): give another path")


class Mirror:
    """--mirror_dir: two files, each rewritten atomically: records.json, every record as it is
    written, and state.json, where the study stands. Two small files, because what leaves a lent
    machine is limited (its device tool returns a few files of at most 16 MiB): a teacher's weights
    (84 MB for the GPU plan's) cannot travel, so a plan is sized to train in one command and the
    mirror keeps what a lost machine would take with it, its records. restore() puts them back on a
    fresh machine; a teacher trained there again must match its record (finished)."""

    def __init__(self, args, command, seal):
        self.args, self.command, self.seal = args, command, seal
        self.path = os.path.join(HERE, args.mirror_dir)
        self.written, self.last = 0.0, None
        self.recorded = []  # the runs records.json holds (keep): observe reads no record

    def file(self, name):
        return os.path.join(self.path, name)

    def records(self):
        """The mirror's records, each validated as a record file is (study_records.validate)."""
        if not os.path.isfile(self.file(MIRROR_RECORDS)):
            return {}
        try:
            with open(self.file(MIRROR_RECORDS), encoding='utf-8') as f:
                records = json.load(f)
            for name, record in records.items():
                study_records.validate(record)
                if record['name'] != name:
                    raise study_records.Invalid(f"{name} holds the record of {record['name']}")
        except (ValueError, AttributeError, study_records.Invalid) as e:
            raise RunError(f"--mirror_dir={self.args.mirror_dir}: {MIRROR_RECORDS} is not a "
                           f"mirror's records ({e}); give another path") from None
        return records

    def restore(self, runs):
        """Before planning: the mirror's records copied into report_dir/runs where absent (a record
        in both that differs is an error). The study's resume logic then trains only what is
        missing."""
        state = mirror_state(self.path)
        if state is None:
            return  # a new mirror
        if state.get('seal') != self.seal:
            raise RunError(f"--mirror_dir={self.args.mirror_dir}: mirrors the study sealed at "
                           f"{state.get('seal')}, not this one's seal ({self.seal}): its runs "
                           "belong to another attempt; give another path")
        mirrored, local = self.records(), read_records(self.args.report_dir)
        unplanned = sorted(set(mirrored) - {r['name'] for r in runs})
        if unplanned:
            raise RunError(f"--mirror_dir={self.args.mirror_dir}: holds records this command does "
                           f"not plan ({', '.join(unplanned[:4])}): give the seeds and settings of "
                           "the study it mirrors")
        for name in sorted(set(mirrored) & set(local)):
            if mirrored[name] != local[name]:
                raise RunError(f"{name}: its record in {self.args.report_dir}/runs differs from "
                               f"the mirror's ({self.args.mirror_dir}): two trainings of one run; "
                               "keep one of them")
        copied = sorted(set(mirrored) - set(local))
        os.makedirs(os.path.join(HERE, self.args.report_dir, 'runs'), exist_ok=True)
        for name in copied:
            write_json(os.path.join(HERE, self.args.report_dir, 'runs', f'{name}.json'),
                       mirrored[name], indent=None, allow_nan=False)
        print(f"mirror {self.args.mirror_dir}: restored {len(copied)} record(s) into "
              f"{self.args.report_dir}/runs ({len(mirrored) - len(copied)} there "
              "already)", flush=True)

    @contextlib.contextmanager
    def writing(self):
        """An OSError writing the mirror (its disk full, say) as a RunError: while runs train,
        run_all then stops them cleanly (each saves its step), and the same command goes on once the
        folder can be written."""
        try:
            yield
        except OSError as e:
            raise RunError(f"--mirror_dir={self.args.mirror_dir}: {describe_os_error(e)}") from None

    def keep(self):
        """records.json made whole from report_dir/runs (a machine's $OUT may start empty), then
        state.json."""
        records = read_records(self.args.report_dir)
        with self.writing():
            os.makedirs(self.path, exist_ok=True)
            write_json(self.file(MIRROR_RECORDS), dict(sorted(records.items())), indent=None,
                       allow_nan=False)
        self.recorded = sorted(records)
        self.observe({}, force=True)

    def observe(self, training, force=False):
        """state.json, where the runs recorded or training changed, every STATE_EVERY seconds while
        only their steps do, or where forced: the plan, the command, the seal, the runs recorded,
        each run training with its last logged step (never a measure: a blind study's runs are read
        only after its last), the time."""
        recorded = self.recorded
        now_state = dict(recorded=recorded, training={name: last_step(run['config'].out_dir)
                                                      for name, run in sorted(training.items())})
        changed = (recorded, sorted(training)) != self.last
        if force or changed or time.time() - self.written >= STATE_EVERY:
            with self.writing():
                os.makedirs(self.path, exist_ok=True)
                write_json(self.file(MIRROR_STATE),
                           dict(plan=self.args.plan, command=self.command, seal=self.seal,
                                **now_state, updated=now()))
            self.written, self.last = time.time(), (recorded, sorted(training))


# -----------------------------------------------------------------------------------------------
# --dry_run: what a command would train, the memory each run shape plans for, and when each run
# would start and end, before a lent GPU's minutes are spent

# the GPU plan's first attempt's records, on one H200: the times
ATTEMPT_1 = 'docs/sink_study_gpu/attempt_1/runs'
ESTIMATE = "ESTIMATE (from attempt_1's runs on one H200)"


def attempt_times(folder=ATTEMPT_1):
    """{'teacher' | 'student': (fixed seconds, seconds per token)} of one run, from the records in
    folder: per token, the mean over a kind's records of its training steps' seconds over its
    tokens; fixed, the least over them of its wall time (started to finished) less those steps and
    its end measures (end_seconds): start and compilation. The least, as attempt_1's wall times also
    hold the records made before theirs, one at a time (its README)."""
    kinds = collections.defaultdict(list)
    for name in sorted(os.listdir(os.path.join(HERE, folder))):
        with open(os.path.join(HERE, folder, name), encoding='utf-8') as f:
            r = json.load(f)
        when = datetime.datetime.fromisoformat
        wall = when(r['finished']) - when(r['started'])
        kinds['teacher' if r['arm'] == 'teacher' else 'student'].append(
            (wall.total_seconds() - r['seconds'] - r['end_seconds'], r['seconds'] / r['tokens']))
    return {kind: (min(f for f, _ in v), statistics.fmean(t for _, t in v)) for kind,
            v in kinds.items()}


def schedule(runs, jobs, seconds):
    """When each run would train as run_all starts them: runs (dicts with name and teacher) in
    priority order on `jobs` slots, run r taking seconds[r['name']]; a free slot (the lowest first)
    takes the first run whose teacher has ended (a teacher not among runs has: it is recorded).
    [dict(name, slot, start, end)] in start order. Pure: the dry run's estimate, which the tests
    hold to run_all's rules."""
    planned = {r['name'] for r in runs}
    pending, running, free, ends, out, t = list(runs), [], list(range(1, jobs + 1)), {}, [], 0.0
    while pending or running:
        for run in [r for r in pending if r['teacher'] not in planned
                    or ends.get(r['teacher'], math.inf) <= t]:
            if not free:
                break
            row = dict(name=run['name'], slot=free.pop(0), start=t, end=t + seconds[run['name']])
            pending.remove(run)
            running.append(row)
            out.append(row)
            ends[run['name']] = row['end']
        if not running:
            raise RunError(f"{pending[0]['name']} waits for its teacher {pending[0]['teacher']}, "
                           "which never starts")
        t = min(row['end'] for row in running)
        free = sorted(free + [row['slot'] for row in running if row['end'] <= t])
        running = [row for row in running if row['end'] > t]
    return out


def memory_plans(runs):
    """{run name: GiB or None} of train.py's own dry run (the run's argv, --dry_run=True, on one
    GPU: each run has its device to itself), printed as train.py says it, once per run shape (the
    argv less seed, out_dir and teacher), the shapes at once: each builds its model on the meta
    device, a few seconds of a CPU."""
    shapes = collections.defaultdict(list)
    for run in runs:
        shapes[tuple(a for a in run['argv']
                     if not a.startswith(('--seed=', '--out_dir=', '--teacher=')))].append(run)
    started = []
    for group in shapes.values():
        command = ['train.py', *group[0]['argv'], '--dry_run=True', '--dry_run_world_size=1']
        started.append((group, command,
                        subprocess.Popen([sys.executable, *command], cwd=HERE, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    said = [(group, command, proc.communicate()[0].rstrip(), proc.returncode) for group, command,
            proc in started]
    plans = {}
    for group, command, out, code in said:
        if code != 0:
            raise RunError(f"{group[0]['name']}: python train.py ... --dry_run=True failed: "
                           f"{out.splitlines()[-1] if out else f'exit code {code}'}")
        more = f" and the {len(group) - 1} more of its shape" if len(group) > 1 else ''
        print(f"the memory plan of {group[0]['name']}{more}: python "
              f"{shlex.join(command)}\n{out}", flush=True)
        total = re.search(r'^\s*total\s+([0-9.]+) GiB', out, re.M)
        plans |= {run['name']: float(total.group(1)) if total else None for run in group}
    return plans


def dry_run(args, runs, steps, per_step):
    """--dry_run=True: nothing trained or written; the memory plan of each shape of run still to
    train (its record not in report_dir/runs) and their schedule on the --jobs slots, each run's
    time from attempt_times scaled by its tokens: a lent GPU's commands sized before its minutes are
    spent. Returns the schedule's rows."""
    teachers = {r['teacher'] for r in runs}
    recorded = set(read_records(args.report_dir))
    todo = sorted((r for r in runs if r['name'] not in recorded), key=lambda r: priority(r, runs))
    print(f"dry run: {len(runs)} runs of {steps:,} steps ({steps * per_step:,} tokens) each, "
          f"{len(runs) - len(todo)} recorded in {args.report_dir}/runs already; nothing is trained "
          "or written", flush=True)
    if not todo:
        return []
    plans, times = memory_plans(todo), attempt_times()

    def estimate(run):
        fixed, per_token = times['teacher' if run['name'] in teachers else 'student']
        return fixed + per_token * steps * per_step

    rows = schedule(todo, args.jobs, {r['name']: estimate(r) for r in todo})
    (fixed, per_token), (s_fixed, s_per_token) = times['teacher'], times['student']
    print(f"the schedule on {args.jobs} slots, every time an {ESTIMATE}: a teacher {fixed:.1f} s + "
          f"{per_token * 1e6:.2f} s per million tokens, a student {s_fixed:.1f} s + "
          f"{s_per_token * 1e6:.2f} s; runs in priority's order, a student once its teacher has "
          "ended")
    for row in rows:
        print(f"  slot {row['slot']}  {row['name']:<24} start {minutes(row['start']):>6}  end "
              f"{minutes(row['end']):>6}  ESTIMATE")
    if None not in plans.values():
        busiest = max(sum(plans[r['name']] for r in rows if r['start'] <= row['start'] < r['end'])
                      for row in rows)
        print(f"memory at the schedule's busiest: {busiest:.2f} GiB of one GPU, the plans of the "
              "runs side by side")
    print(f"total {minutes(max(row['end'] for row in rows))}, {ESTIMATE}; not counted: the "
          "machine's start, preparing the corpus, and the end measures (on the GPU while the next "
          "runs train; attempt_1 made them on one CPU thread, 22.6-57.2 s a run)", flush=True)
    return rows


if __name__ == '__main__':
    run_script(main)
