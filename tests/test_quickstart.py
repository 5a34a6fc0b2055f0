"""quickstart.py end to end at a few steps: every stage runs, report.md holds the table and the figures, and a
second run skips what the first finished."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quickstart(tmp_path, *extra):
    command = [sys.executable, 'quickstart.py', f'--out_dir={tmp_path / "qs"}', f'--data_dir={tmp_path / "data"}',
               '--teacher_iters=3', '--student_iters=2', '--variants=softmax,affine', *extra]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


def test_quickstart_runs_every_stage_and_skips_them_when_rerun(tmp_path):
    output = quickstart(tmp_path)
    for stage in ('train the softmax teacher', 'distill softmax seed 0', 'distill affine seed 0',
                  'evaluate affine seed 0', 'analyse: table', 'analyse: attention', 'analyse: runs'):
        assert f'] {stage} (at' in output
    out = tmp_path / 'qs'
    report = (out / 'report.md').read_text()
    assert re.search(r'\| Baseline \| 0 \| [*\d.]+ \| [*\d.]+ \| [*\d.]+ \| [*\d.]+ \|', report)
    assert '| Affine-Scaled | 2,048 |' in report  # W_alpha: 4 layers x 128 x 4 heads
    assert 'Seeds: 0.' in report and 'One run per method' in report
    for figure in re.findall(r'\]\(([^)]+\.png)\)', report):
        assert (out / figure).stat().st_size > 1000
    assert len(re.findall(r'\]\(([^)]+\.png)\)', report)) == 10  # Figures 3-6, 9, alpha; 2, 7, 8, 10
    rerun = quickstart(tmp_path)
    assert re.search(r'distill affine seed 0 \(at \d+m\d+s\): finished in an earlier run, skipped', rerun)
    assert 'train.py' not in rerun and 'eval_zeroshot.py' not in rerun


def test_quickstart_bad_arguments_say_what_is_valid():
    for args, message in [(['--variants=softmax,flash'], "unknown ['flash']"), (['--seeds=a'], 'comma-separated')]:
        run = subprocess.run([sys.executable, 'quickstart.py', *args], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr
