"""A run directory has one writer (files.lock_dir), its log survives a crash mid-line
(files.read_log), and a start that is refused writes nothing; a resume may lower the learning rate
when asked to, and says so in the log."""
import errno
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

import analyze
from lmkit import files
import train
from lmkit.errors import RunError
from helpers import ROOT, metrics, tiny_args


def test_a_second_writer_is_refused_and_a_killed_writer_does_not_block_the_same_command(data_dir,
                                                                                        tmp_path,
                                                                                        capsys):
    run = tmp_path / 'run'
    args = tiny_args(data_dir, run, '--eval_interval=1', '--decay_frac=0.0', '--max_iters=1000000')
    first = subprocess.Popen([sys.executable, 'train.py', *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / 'ckpt.pt').exists():
            time.sleep(0.05)
        with pytest.raises(RunError) as e:
            train.main(args)
        message = str(e.value)
        assert (f"{run}: another train.py writes there (pid {first.pid} "
                f"on host {socket.gethostname()}, " in message)
        assert '\n' not in message
    finally:
        first.kill()  # SIGKILL: no chance to remove its lock file
        first.wait()
    assert (run / files.LOCK_NAME).exists()
    capsys.readouterr()
    step = torch.load(run / 'ckpt.pt', weights_only=False)['step']
    train.main(args[:-1] + [f'--max_iters={step + 1}'])  # the same command (with an end in sight)
    assert (capsys.readouterr().out.startswith(f"init_from=auto: resuming from {run / 'ckpt.pt'} "
                                               f"at step {step}\n"))
    assert not (run / files.LOCK_NAME).exists()
    # each step once
    assert [r['step'] for r in analyze.load_run(str(run))['records']] == list(range(1, step + 2))


def test_lock_dir_refuses_a_second_holder_and_leaves_no_empty_directory(tmp_path, monkeypatch,
                                                                        capsys):
    target = tmp_path / 'new' / 'run'
    with pytest.raises(RunError, match='a fault before the first write'):
        with files.lock_dir(str(target), 'train.py'):
            holder = json.loads((target / files.LOCK_NAME).read_text())
            assert (holder['pid'], holder['host'], holder['owner']) == (os.getpid(),
                                                                        socket.gethostname(),
                                                                        'train.py')
            with pytest.raises(RunError,
                               match=re.escape(
                    f"another train.py writes there (pid {os.getpid()} on host ")):
                # another open file: flock refuses it too
                with files.lock_dir(str(target), 'train.py'):
                    pass
            assert (target / files.LOCK_NAME).exists()  # the refused one removed nothing
            raise RunError('a fault before the first write')
    # nothing written: the directories it made are gone with the lock
    assert not (tmp_path / 'new').exists()
    with pytest.raises(ValueError):
        with files.lock_dir(str(target), 'train.py'):
            (target / 'config.json').write_text('{}')
            raise ValueError('a fault after the first write')
    assert os.listdir(target) == ['config.json']  # released on an error too

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, 'No locks available')
    monkeypatch.setattr(files.fcntl, 'flock', no_locks)
    with files.lock_dir(str(target), 'train.py'):
        pass
    assert 'this file system has no file locks (No locks available)' in capsys.readouterr().err


def test_a_refused_start_writes_nothing(data_dir, tmp_path, monkeypatch):
    out = tmp_path / 'new' / 'run'
    # `import wandb` fails as when it is not installed
    monkeypatch.setitem(sys.modules, 'wandb', None)
    with pytest.raises(RunError, match='wandb_log=True needs the wandb package, which is not '
                                       'installed') as e:
        train.main(tiny_args(data_dir, out, '--max_iters=1', '--wandb_log=True'))
    assert '\n' not in str(e.value) and not (tmp_path / 'new').exists()
    # found once out_dir is held: it is removed with the lock
    with pytest.raises(RunError, match='teacher'):
        train.main(tiny_args(data_dir, out, '--max_iters=1', f'--teacher={tmp_path / "nothing"}'))
    assert not (tmp_path / 'new').exists()


def test_read_log_drops_only_a_cut_last_line(tmp_path, capsys):
    path = tmp_path / 'metrics.jsonl'
    # mid-record, a power loss, UTF-8
    for cut in (b'{"step": 3, "lo', b'\0\0\0\0', b'{"step": 3, "loss": "\xe2\x82'):
        path.write_bytes(b'{"step": 1}\n{"step": 2}\n' + cut)
        assert files.read_log(str(path)) == [{'step': 1}, {'step': 2}]
        assert f"note: {path}: line 3, the last, is cut short" in capsys.readouterr().err
    path.write_bytes(b'{"step": 1}\n{"step": 2}')  # whole, only its newline missing
    assert files.read_log(str(path)) == [{'step': 1}, {'step': 2}]
    for damaged in (b'{"step": 1}\n{"st\n{"step": 3}\n', b'{"step": 1}\n\n{"step": 3}\n',
                    b'{"step": 1}\n[2]\n', b'{"step": 1}\n{"loss": 2.0}'):
        path.write_bytes(damaged)
        with pytest.raises(RunError,
                           match=re.escape(f"{path}: line 2 is not a record with a step")) as e:
            files.read_log(str(path))
        assert '\n' not in str(e.value)


def test_resume_after_a_cut_log_line_with_a_lower_learning_rate(data_dir, tmp_path, capsys):
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=2', '--eval_interval=2'))
    log = tmp_path / 'metrics.jsonl'
    # killed while writing step 3's record
    log.write_text(log.read_text() + '{"step": 3, "lr": 0.00')
    assert [r['step'] for r in analyze.load_run(str(tmp_path))['records']] == [1, 2]
    with pytest.raises(RunError, match=r"learning_rate: 0.001 -> 0.0005\n.*learning_rate and "
                                       r"min_lr with "
                                       r"--resume_lr_change=True \(recorded in metrics.jsonl\)"):
        train.main(tiny_args(data_dir, tmp_path, '--max_iters=3', '--learning_rate=5e-4'))
    capsys.readouterr()
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=3', '--learning_rate=5e-4',
                         '--resume_lr_change=True'))
    out, err = capsys.readouterr()
    assert f"{log}: line 3, the last, is cut short" in err
    assert out.startswith(f"init_from=auto: resuming from {tmp_path / 'ckpt.pt'} at step 2; "
                          "learning_rate 0.001 -> 0.0005 (resume_lr_change=True)\n")
    records = metrics(tmp_path)
    assert [r['step'] for r in records] == [1, 2, 3, 3]
    assert records[2] == {'step': 3, 'event': 'resume_lr_change',
                          'learning_rate': {'from': 0.001, 'to': 0.0005}}
    # warmup_iters=2, so steps 1-2 ran at 0.001 x 1/2 and x 2/2; step 3, past the warmup, at the new
    # rate
    assert [r['lr'] for r in records if 'lr' in r] == [0.0005, 0.001, 0.0005]
    # the event left out
    assert [r['step'] for r in analyze.load_run(str(tmp_path))['records']] == [1, 2, 3]
    assert torch.load(tmp_path / 'ckpt.pt', weights_only=False)['config']['learning_rate'] == 5e-4


def test_a_fresh_start_keeps_the_log_it_finds(data_dir, tmp_path, capsys):
    """Train 6 steps, delete the run's checkpoints, run again with --max_iters=2: the run started
    fresh and replaced the log (6 lines became 2). The earlier log is now kept aside under a new
    name, in one line; so is the log a start over with init_from=scratch --overwrite=True replaces
    the checkpoint of."""
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=6', '--eval_interval=3'))
    for name in ('ckpt.pt', 'ckpt.prev.pt'):
        os.remove(tmp_path / name)
    capsys.readouterr()
    logs = {}  # name -> the steps it holds, of every log kept aside so far

    def kept_aside():
        names = [name for name in os.listdir(tmp_path)
                 if re.fullmatch(r'metrics\.\d{8}-\d{6}(-\d+)?\.jsonl', name)]
        new = [name for name in names if name not in logs]
        logs.update({name: [r['step'] for r in files.read_log(str(tmp_path / name))]
                     for name in new})
        assert len(new) == 1, names
        assert (f"note: {tmp_path / 'metrics.jsonl'} holds the log of an earlier run in "
                f"{tmp_path}, which this one does not continue: kept as {tmp_path / new[0]}; a new "
                "log begins") in capsys.readouterr().err
        return logs[new[0]]

    train.main(tiny_args(data_dir, tmp_path, '--max_iters=2'))
    assert kept_aside() == [1, 2, 3, 4, 5, 6] and [r['step'] for r in metrics(tmp_path)] == [1, 2]
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=1', '--init_from=scratch',
                         '--overwrite=True'))
    assert kept_aside() == [1, 2] and [r['step'] for r in metrics(tmp_path)] == [1]
