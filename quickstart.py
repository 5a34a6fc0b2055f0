"""
The whole study on a laptop CPU, offline, in one command: data, a teacher, a distilled student per attention
variant, zero-shot evaluation, the paper's analyses and a Table-1-style report.

    python quickstart.py                  # writes out/quickstart/report.md, with the time each stage took
    python quickstart.py --seeds=0,1,2    # three students per variant: mean ± std, and what is within noise
    python quickstart.py --tests          # the test suite instead (what CI runs)

Both first install what is missing (requirements.txt and matplotlib; --tests: requirements-test.txt too). Stages:
  1. prepare the built-in corpus: Python's own documentation (pydoc_data), byte tokens, no network;
  2. train a small softmax teacher (config/quickstart_teacher.py);
  3. distill one student per variant and seed from it (config/quickstart_student.py, pure KD as the paper);
  4. evaluate each student on the offline multiple-choice task (eval_zeroshot.py --tasks=heldout);
  5. analyse (analyze.py table, runs and attention) and write report.md.
Every stage runs as its own command, printed before it runs, so any step can be rerun by hand. Re-running skips
what is finished; an interrupted training resumes from its last checkpoint. Only the standard library is imported
here, so that the install step can run first.
"""
import importlib.util
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

from configurator import Key, fail, parse  # pure Python: it runs before the install

VARIANTS = ('softmax', 'sink', 'gated', 'affine', 'affine_gated')
KEYS = dict(
    tests=Key(False, "install the test requirements and run the test suite"),
    seeds=Key([0], "comma-separated student seeds, e.g. 0,1,2"),
    variants=Key(list(VARIANTS), "comma-separated attention variants"),
    out_dir=Key('out/quickstart'),
    data_dir=Key('data/builtin_bytes'),
    teacher_iters=Key(0, "teacher steps (0: the config's)"),
    student_iters=Key(0, "student steps (0: the config's)"),
)
NEEDED = dict(torch='torch', numpy='numpy', tiktoken='tiktoken', datasets='datasets', safetensors='safetensors',
              matplotlib='matplotlib')  # import name: what pip installs
TEST_NEEDED = dict(pytest='pytest', tokenizers='tokenizers', transformers='transformers')
HERE = os.path.dirname(os.path.abspath(__file__))


def install(needed, requirement_files):
    """pip-install the requirement files (and matplotlib) when any of the needed modules is missing."""
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not missing:
        return
    command = [sys.executable, '-m', 'pip', 'install']
    for path in requirement_files:
        command += ['-r', os.path.join(HERE, path)]
    if 'matplotlib' in missing:
        command.append('matplotlib>=3.7')
    print(f"missing {', '.join(missing)}: {shlex.join(command)}", flush=True)
    if subprocess.call(command) != 0:
        sys.exit("installing failed (above); without a network, install the packages of requirements.txt by hand "
                 "(a CPU-only machine: install torch's CPU build first, see the README)")


def minutes(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Stages:
    """Runs the study's commands in order, each once: a stage whose marker file exists is skipped."""

    def __init__(self, out_dir, total):
        self.out_dir, self.total, self.done, self.t0 = out_dir, total, 0, time.time()
        self.times = []  # (stage, seconds, skipped)
        os.makedirs(os.path.join(out_dir, 'done'), exist_ok=True)

    def run(self, name, command, always=False):
        self.done += 1
        marker = os.path.join(self.out_dir, 'done', re.sub(r'\W+', '_', name))
        header = f"[{self.done}/{self.total}] {name} (at {minutes(time.time() - self.t0)})"
        if os.path.exists(marker) and not always:
            print(f"{header}: finished in an earlier run, skipped", flush=True)
            self.times.append((name, 0.0, True))
            return
        print(f"\n{header}\n$ {shlex.join(command)}", flush=True)
        start = time.time()
        rc = subprocess.call(command, cwd=HERE)
        if rc != 0:
            sys.exit(f"\n{name} failed (exit code {rc}; its output is above). Fix it and run python quickstart.py "
                     f"again: finished stages are skipped.")
        self.times.append((name, time.time() - start, False))
        open(marker, 'w').close()


def train_command(config, out_dir, *overrides):
    """train.py on a config; where an earlier run left a checkpoint behind, train.py continues from it by itself
    (init_from='auto')."""
    return [sys.executable, 'train.py', config, f'--out_dir={out_dir}', *overrides]


def include(path, subdir):
    """A job's report.md as a section of ours: headings one level down, figures found in subdir."""
    with open(path) as f:
        lines = f.read().splitlines()
    return [('#' + line if line.startswith('#') else re.sub(r'\]\((fig[^)]*\.png)\)', rf']({subdir}/\1)', line))
            for line in lines]


def write_report(out_dir, args, stages, students):
    """report.md: what ran (machine, seeds, times, commands), the table, the analyses, and what they can show."""
    import torch  # installed by now
    lines = ['# Quick start report', '',
             f"Machine: {platform.platform()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
             f"torch {torch.__version__}. Seeds: {', '.join(map(str, args.seeds))}. Wall time of this run: "
             f"{minutes(time.time() - stages.t0)}.", '',
             'A softmax teacher (config/quickstart_teacher.py, 6 layers) trained on the built-in corpus (Python\'s '
             'documentation, byte tokens); one 4-layer student per variant and seed distilled from it with pure KD '
             '(config/quickstart_student.py); each student evaluated on the held-out multiple-choice task '
             '(eval_zeroshot.py --tasks=heldout: pick the true continuation of a validation passage among 4) and '
             'its validation perplexity.', '',
             '**What this can and cannot show.** These models have well under a million parameters and see half a '
             'million tokens. They show every part of the method running end to end and the analyses the paper '
             'makes; they cannot reproduce the paper\'s gaps between variants (Table 1: differences of 0.5-1.6 '
             'accuracy points at 0.5B-3B parameters and 20B tokens). Read differences below against the '
             'run-to-run noise the table reports (run --seeds=0,1,2 to measure it).', '']
    lines += include(os.path.join(out_dir, 'table', 'report.md'), 'table')
    lines += ['']
    lines += include(os.path.join(out_dir, 'attention', 'report.md'), 'attention')
    lines += ['']
    lines += include(os.path.join(out_dir, 'runs', 'report.md'), 'runs')
    lines += ['', '## Stages', '', '| stage | time |', '|---|---|']
    lines += [f"| {name} | {'done earlier' if skipped else minutes(seconds)} |" for name, seconds, skipped in stages.times]
    lines += ['', f"Students: {', '.join(f'`{d}`' for d in students)}."]
    with open(os.path.join(out_dir, 'report.md.tmp'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.replace(os.path.join(out_dir, 'report.md.tmp'), os.path.join(out_dir, 'report.md'))


def main(argv=None):
    args = SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS, __doc__.split('\n\n')[1],
                                   prog='quickstart.py'))
    if args.tests:
        install({**NEEDED, **TEST_NEEDED}, ['requirements.txt', 'requirements-test.txt'])
        sys.exit(subprocess.call([sys.executable, '-m', 'pytest', '-q', 'tests'], cwd=HERE))
    variants = args.variants
    if unknown := [v for v in variants if v not in VARIANTS]:  # (this message, not the configurator's: tests read it)
        fail(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    install(NEEDED, ['requirements.txt'])

    out, data, python = args.out_dir, args.data_dir, sys.executable
    students = [(v, s, f'{out}/{v}_seed{s}') for s in args.seeds for v in variants]
    stages = Stages(os.path.join(HERE, out), 2 + 2 * len(students) + 3)
    stages.run('prepare the built-in corpus', [python, 'prepare_data.py', '--source=builtin', '--tokenizer=bytes',
                                               f'--out_dir={data}', '--val_every=10'], always=True)
    teacher = f'{out}/teacher'
    iters = lambda n: [f'--max_iters={n}'] if n else []
    stages.run('train the softmax teacher', train_command('config/quickstart_teacher.py', teacher,
                                                          f'--data_dir={data}', *iters(args.teacher_iters)))
    for variant, seed, student in students:
        stages.run(f'distill {variant} seed {seed}', train_command(
            'config/quickstart_student.py', student, f'--attention={variant}', f'--seed={seed}',
            f'--teacher={teacher}', f'--data_dir={data}', *iters(args.student_iters)))
    for variant, seed, student in students:
        stages.run(f'evaluate {variant} seed {seed}', [python, 'eval_zeroshot.py', f'--ckpt={student}',
                                                       '--tasks=heldout', f'--heldout_data={data}',
                                                       f'--out={student}/eval.json'])
    dirs = [student for _, _, student in students]
    with open(os.path.join(HERE, dirs[0], 'config.json')) as f:
        steps = json.load(f)['max_iters']
    analyze = [python, 'analyze.py']
    stages.run('analyse: table', analyze + ['table', *dirs, f'--out_dir={out}/table'], always=True)
    stages.run('analyse: attention', analyze + ['attention', *[d for d in dirs if d.endswith(f'_seed{args.seeds[0]}')],
                                                f'--out_dir={out}/attention', f'--data={data}'], always=True)
    stages.run('analyse: runs', analyze + ['runs', *dirs, f'--out_dir={out}/runs', f'--window=0,{min(500, steps)}',
                                           f'--late={steps // 2}'], always=True)
    write_report(os.path.join(HERE, out), args, stages, dirs)
    print(f"\nwrote {out}/report.md in {minutes(time.time() - stages.t0)}")


if __name__ == '__main__':
    main()
