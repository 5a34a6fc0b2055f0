"""Nothing a user owns is ever lost, and every fault is one clear line: each writer leaves files it
did not write byte for byte and refuses another tool's directory; a damaged checkpoint is refused
(its checksums) and nothing is written over it; a full disk, a read-only file system, a denied
permission are one line, with no temporary file left and the previous checkpoint intact."""
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

import analyze
from lmkit import checkpoint
from lmkit import distributed as devices
from lmkit import errors
from lmkit import files
import eval_zeroshot
import prepare_data
import train
from model import GPT
from helpers import fake_run, refusal, tiny_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def run_dir(data_dir, tmp_path_factory):
    """A tiny train.py run with two saves (ckpt.pt at step 2, ckpt.prev.pt at step 1), to copy."""
    out = tmp_path_factory.mktemp('run') / 'run'
    train.main(tiny_args(data_dir, out, '--max_iters=2', '--eval_interval=1'))
    return out


def snapshot(root):
    """Every file under root (relative path -> sha256 of its bytes)."""
    return {os.path.relpath(os.path.join(d, name),
                            root): hashlib.sha256(open(os.path.join(d, name), 'rb').read())
            .hexdigest() for d, _, names in os.walk(root) for name in names}


def script(*args, **kwargs):
    """Run one of the scripts as a user does; (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          **kwargs)
    return done.returncode, done.stdout, done.stderr


def one_line(stderr):
    """The one line a fault gives (asserting that it is one, with no traceback)."""
    assert 'Traceback' not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size, readonly=False): a small tmpfs of its own under tmp_path (skips where
    mounting is not allowed); unmounted afterwards."""
    mounted = []

    def mount(name, size, readonly=False):
        path = tmp_path / name
        path.mkdir()
        options = f"size={size}" + (',ro' if readonly else '')
        done = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(path)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'})")
        mounted.append(path)
        return path
    yield mount
    for path in mounted:
        subprocess.run(['umount', str(path)], check=True)

# -----------------------------------------------------------------------------
# 1. Writers write only their own files


def test_analyze_pointed_at_runs_never_deletes_them(tmp_path, capsys):
    """The bug a user hit: analyze.py table outcopy/softmax outcopy/affine --out_dir=outcopy deleted
    both runs and a NOTES.txt; analyze.py runs RUN --out_dir=RUN wiped the run."""
    outcopy = tmp_path / 'outcopy'
    fake_run(outcopy / 'softmax', 'softmax', [1.0] * 600)
    fake_run(outcopy / 'affine', 'affine', [1.0] * 600)
    # (analyze.py table reads what identifies the data from the checkpoint)
    for run in ('softmax', 'affine'):
        torch.save(dict(data=dict(tokenizer='a' * 64, train_tokens=10, val_tokens=1),
                        weeks_of_gpu_time=1),
                   outcopy / run / 'ckpt.pt')
        (outcopy / run / 'eval.json').write_text(json.dumps({'heldout': {'acc': 0.5,
                                                                         'acc_norm': 0.5, 'n': 10},
                                                             'c4': {'ppl': 30.0, 'n': 10}}))
    (outcopy / 'NOTES.txt').write_text('my notes')
    before = snapshot(outcopy)
    # analyze.py's command line, run as a process by test_a_read_only_file_system_is_one_line, here
    # through its entry point in this process
    analyze.main(['table', str(outcopy / 'softmax'), str(outcopy / 'affine'),
                  f'--out_dir={outcopy}'])
    after = snapshot(outcopy)
    # every file there before is there, byte for byte
    assert {name: after[name] for name in before} == before
    # and only the report's files were added
    assert set(after) - set(before) == {'report.md', 'numbers.json'}
    run = outcopy / 'softmax'
    before = snapshot(run)
    assert 'holds a train.py run' in refusal(capsys, analyze.main,
                                             ['runs', str(run), f'--out_dir={run}'])
    assert snapshot(run) == before


def test_analyze_rewrites_only_its_own_report(tmp_path):
    fake_run(tmp_path / 'softmax', 'softmax', [1.0] * 600)
    out = tmp_path / 'report'
    analyze.main(['runs', str(tmp_path / 'softmax'), f'--out_dir={out}'])
    (out / 'NOTES.txt').write_text('keep me')
    # not in the report's list: not ours
    (out / 'fig_old.png').write_bytes(b'a figure of an earlier version')
    numbers = json.loads((out / 'numbers.json').read_text())
    numbers['files'].append('stale.png')  # a figure the earlier report wrote and this one does not
    (out / 'numbers.json').write_text(json.dumps(numbers))
    (out / 'stale.png').write_bytes(b'old')
    analyze.main(['runs', str(tmp_path / 'softmax'), f'--out_dir={out}'])
    assert (out / 'NOTES.txt').read_text() == 'keep me'
    assert (out / 'fig_old.png').read_bytes() == b'a figure of an earlier version'
    assert not (out / 'stale.png').exists() and not (out / '.analyze.tmp').exists()
    assert json.loads((out / 'numbers.json').read_text())['files'] == sorted(
        ['fig2_attn_logit.png', 'fig7_loss.png', 'fig8_grad_norm.png', 'fig10_loss_late.png',
         'numbers.json', 'report.md'])


@pytest.mark.parametrize('other', ['data', 'hf_model', 'report'])
def test_train_refuses_another_tools_directory(data_dir, tmp_path, other, capsys):
    out = tmp_path / other
    if other == 'data':
        shutil.copytree(data_dir, out)
    elif other == 'hf_model':
        out.mkdir()
        (out / 'config.json').write_text(json.dumps({'model_type': 'llama'}))
        (out / 'model.safetensors').write_bytes(b'weights')
    else:
        out.mkdir()
        (out / 'report.md').write_text('# a report')
        (out / 'numbers.json').write_text('{}')
    before = snapshot(out)
    assert f"{out}: holds" in refusal(capsys, train.main, tiny_args(data_dir, out, '--max_iters=1'))
    assert snapshot(out) == before


def test_train_keeps_a_users_file_in_its_run(data_dir, run_dir, tmp_path):
    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    (run / 'NOTES.txt').write_text('lr sweep, second try')
    # resumes, saves twice more
    train.main(tiny_args(data_dir, run, '--max_iters=3', '--eval_interval=1'))
    assert (run / 'NOTES.txt').read_text() == 'lr sweep, second try'
    assert sorted(os.listdir(run)) == ['NOTES.txt', 'ckpt.prev.pt', 'ckpt.pt', 'config.json',
                                       'metrics.jsonl']
    assert torch.load(run / 'ckpt.prev.pt', weights_only=False)['step'] == 2


def test_eval_out_refuses_a_file_it_did_not_write(tmp_path, capsys):
    foreign = tmp_path / 'config.json'
    foreign.write_text(json.dumps({'model_type': 'llama'}))
    code, _, err = script('eval_zeroshot.py', f'--ckpt={tmp_path / "nothing"}', f'--out={foreign}')
    # before reading the model
    assert code == 1 and 'holds something else than an earlier result' in one_line(err)
    assert json.loads(foreign.read_text()) == {'model_type': 'llama'}
    # (issue 53)
    line = refusal(capsys, eval_zeroshot.main,
                   [f'--ckpt={tmp_path / "nothing"}', f'--out={tmp_path}'])
    assert line.endswith(f"--out={tmp_path}: is a directory; --out is the JSON file this run "
                         f"writes, e.g. --out={tmp_path / 'eval.json'}")
    earlier = tmp_path / 'eval.json'
    earlier.write_text(json.dumps({'heldout': {'acc': 0.25, 'n': 4}}))
    assert eval_zeroshot.is_eval_result(earlier) and not eval_zeroshot.is_eval_result(foreign)


def test_export_refuses_to_replace_an_export_holding_other_files(run_dir, tmp_path):
    """The refusal as a user meets it (export_hf.py's command line: one line, exit status 1); the
    exports before and after it, whose only check is that they succeed, in this process."""
    import export_hf
    out = tmp_path / 'export'
    argv = [f'--ckpt={run_dir}', f'--out_dir={out}', '--check=False']
    export_hf.main(argv)
    (out / 'NOTES.txt').write_text('which run this was')
    (tmp_path / 'beside.txt').write_text('beside the export')
    before = snapshot(tmp_path)
    code, _, err = script('export_hf.py', *argv, '--overwrite')
    assert code == 1 and 'NOTES.txt' in one_line(err) and 'move them out first' in err
    assert snapshot(tmp_path) == before
    os.remove(out / 'NOTES.txt')
    export_hf.main([*argv, '--overwrite'])
    assert (tmp_path / 'beside.txt').read_text() == 'beside the export'


def test_prepare_data_removes_only_its_own_unconfirmed_files(data_dir, tmp_path):
    out = tmp_path / 'data'
    shutil.copytree(data_dir, out)
    meta = json.loads((out / 'meta.json').read_text())
    # an interrupted run: its unconfirmed shards are removed on resume, nothing else
    meta['complete'] = False
    (out / 'meta.json').write_text(json.dumps(meta))
    (out / 'train_000099.bin').write_bytes(b'an unconfirmed shard of ours')
    for name in ('NOTES.txt', 'extra.bin', 'train_1.bin', 'notes.tmp'):
        (out / name).write_text('the user\'s')
    prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={out}',
                       '--val_every=10', '--num_proc=1'])
    assert not (out / 'train_000099.bin').exists()
    for name in ('NOTES.txt', 'extra.bin', 'train_1.bin', 'notes.tmp'):
        assert (out / name).read_text() == 'the user\'s'
    fresh = tmp_path / 'fresh'
    fresh.mkdir()
    (fresh / 'notes.tmp').write_text('the user\'s')
    with pytest.raises(errors.RunError, match='is not empty and has no meta.json'):
        prepare_data.main(['--source=builtin', f'--out_dir={fresh}'])
    assert os.listdir(fresh) == ['notes.tmp']


def test_bench_check_json_refuses_a_file_it_did_not_write(tmp_path):
    """Through tools/bench.py --check, which hands over to gpu_check: the check's one line and exit
    status 1."""
    foreign = tmp_path / 'results.json'
    foreign.write_text('{"mine": 1}')
    code, _, err = script('-m', 'tools.bench', '--check', f'--check_json={foreign}')
    assert code == 1 and 'holds something else than an earlier --check record' in one_line(err)
    assert foreign.read_text() == '{"mine": 1}'


def test_the_check_record_goes_under_out_by_default(tmp_path, monkeypatch):
    """tools/gpu_check.py's JSON goes to out/bench_check.json unless told otherwise (never into the
    repository's root), its folder made where missing."""
    from tools import gpu_check
    monkeypatch.chdir(tmp_path)
    gpu_check.Check(gpu_check.KEYS['check_json'].default, dict(device='cpu'))
    assert json.loads((tmp_path / 'out' / 'bench_check.json').read_text()) == dict(device='cpu',
                                                                                   rows=[])

# -----------------------------------------------------------------------------
# 2. Checksums: a damaged checkpoint is refused, and nothing is written over it


def damage(path, record_index=0):
    """Flip one bit in the middle of a tensor's bytes (the record-th data record of a torch.save'd
    zip)."""
    with zipfile.ZipFile(path) as archive:
        info = sorted((i for i in archive.infolist() if '/data/' in i.filename
                       and i.file_size > 64),
                      key=lambda i: i.header_offset)[record_index]
    with open(path, 'r+b') as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = int.from_bytes(f.read(2), 'little'), int.from_bytes(f.read(2),
                                                                                        'little')
        f.seek(info.header_offset + 30 + name_length + extra_length + info.file_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))


def test_every_record_of_a_checkpoint_carries_a_checksum(run_dir):
    with zipfile.ZipFile(run_dir / 'ckpt.pt') as archive:
        records = [i for i in archive.infolist() if '/data/' in i.filename and i.file_size]
    assert len(records) > 10 and all(i.CRC != 0 for i in records)


def test_a_damaged_checkpoint_is_refused_and_kept(data_dir, run_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    damage(run / 'ckpt.pt')
    before = snapshot(run)
    line = refusal(capsys, train.main,
                   tiny_args(data_dir, run, '--max_iters=4', '--eval_interval=1'))
    assert f"{run / 'ckpt.pt'} is damaged" in line and 'does not match the checksum' in line
    assert f"mv {run / 'ckpt.prev.pt'} {run / 'ckpt.pt'}" in line  # the copy to fall back to
    assert snapshot(run) == before  # nothing written over it (nor the metrics)
    for read in (lambda: GPT.from_pretrained(str(run)),
                 lambda: checkpoint.read_checkpoint(str(run / 'ckpt.pt'))):
        with pytest.raises(checkpoint.CheckpointError, match='is damaged'):
            read()
    code, _, err = script('eval_zeroshot.py', f'--ckpt={run}', '--tasks=heldout',
                          f'--heldout_data={data_dir}')
    assert code == 1 and 'is damaged' in one_line(err)
    # falling back as the message says continues the run from step 1
    os.replace(run / 'ckpt.prev.pt', run / 'ckpt.pt')
    train.main(tiny_args(data_dir, run, '--max_iters=3', '--eval_interval=1'))
    assert torch.load(run / 'ckpt.pt', weights_only=False)['step'] == 3


def test_damage_in_the_optimizer_state_stops_a_resume_but_not_a_read_of_the_model(run_dir,
                                                                                  tmp_path):
    path = tmp_path / 'ckpt.pt'
    shutil.copy(run_dir / 'ckpt.pt', path)
    model_records = len(torch.load(path, weights_only=False)['model'])
    damage(path, record_index=model_records + 2)  # saved after the model's tensors: the optimizer's
    assert checkpoint.read_checkpoint(str(path))['step'] == 2  # the model's tensors are intact
    with pytest.raises(checkpoint.CheckpointError, match=r'optimizer\.state'):
        checkpoint.read_checkpoint(str(path), keys=checkpoint.CKPT_KEYS)


def test_a_checkpoint_without_checksums_loads_with_a_note(tmp_path, capsys):
    from torch.utils.serialization import config
    path = str(tmp_path / 'ckpt.pt')
    state = dict(model={'w': torch.randn(64, 64)}, model_config={}, tokenizer={})
    config.save.compute_crc32 = False
    try:
        torch.save(state, path)
    finally:
        config.save.compute_crc32 = True
    assert torch.equal(checkpoint.read_checkpoint(path)['model']['w'], state['model']['w'])
    assert 'was saved without checksums: read unverified' in capsys.readouterr().err

# -----------------------------------------------------------------------------
# 3. OS faults: one line, nothing lost


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmpfs):
    disk = tmpfs('disk', '1m')
    path = str(disk / 'ckpt.pt')
    checkpoint.save_checkpoint(path, {'step': 1, 'w': torch.zeros(1000)})
    with pytest.raises(OSError) as error:
        # 4 MB on a 1 MB disk
        checkpoint.save_checkpoint(path, {'step': 2, 'w': torch.zeros(1_000_000)})
    assert error.value.errno == errno.ENOSPC and error.value.filename == path
    assert (errors.describe_os_error(error.value).startswith(f"{path}: no space left on the "
                                                             "device; free some space"))
    assert torch.load(path, weights_only=False)['step'] == 1
    assert sorted(os.listdir(disk)) == ['ckpt.pt']  # no temporary file filling the disk


def test_train_on_a_full_disk_is_one_line(data_dir, tmpfs):
    # room for config.json and metrics.jsonl, not for the first checkpoint
    disk = tmpfs('disk', '200k')
    out = disk / 'run'
    code, _, err = script('train.py',
                          *tiny_args(data_dir, out, '--max_iters=2', '--eval_interval=1'))
    line = one_line(err)
    assert code == 1 and line.startswith(
        f"train.py: error: {out / 'ckpt.pt'}: no space left on the device"), line
    assert not [name for name in os.listdir(out) if name.endswith('.tmp')]


def test_a_read_only_file_system_is_one_line(data_dir, run_dir, tmpfs):
    read_only = tmpfs('ro', '1m', readonly=True)
    code, _, err = script('train.py', *tiny_args(data_dir, read_only / 'run', '--max_iters=1'))
    assert (code == 1
            and one_line(err) == (f"train.py: error: {read_only / 'run'}: read-only file system; "
                                  "write to a writable location"))
    code, _, err = script('export_hf.py', f'--ckpt={run_dir}', f'--out_dir={read_only / "export"}',
                          '--check=False')
    assert code == 1 and 'read-only file system' in one_line(err)
    code, _, err = script('prepare_data.py', '--source=builtin', f'--out_dir={read_only / "data"}',
                          '--num_proc=1')
    assert code == 1 and 'read-only file system' in one_line(err)
    # (issue 62) before any analysis: found before a checkpoint that does not exist is looked for
    code, _, err = script('analyze.py', 'attention', str(read_only / 'no_such_run'),
                          f'--out_dir={read_only / "analysis"}')
    assert code == 1 and one_line(err) == (f"analyze.py: error: {read_only / 'analysis'}: "
                                           "read-only file system; write to a writable location")


def test_permission_denied_and_missing_paths_are_one_line(data_dir, tmp_path, capsys):
    def denied(argv):
        raise PermissionError(errno.EACCES, 'Permission denied', str(tmp_path / 'run'))
    with pytest.raises(SystemExit) as exit:
        errors.run_script(denied, [])
    assert exit.value.code == 1
    assert (capsys.readouterr().err.endswith(f"error: {tmp_path / 'run'}: permission denied; check "
                                             "the permissions (ls -ld) or write elsewhere\n"))
    line = refusal(capsys, train.main, ['--device=cpu', f'--data_dir={tmp_path / "missing"}',
                                        f'--out_dir={tmp_path / "run"}'])
    assert 'missing: no such directory; run prepare_data.py first' in line
    code, _, err = script('distill.py', f'--teacher={tmp_path / "missing"}',
                          f'--data_dir={data_dir}')
    assert code == 1 and 'missing' in one_line(err)

# -----------------------------------------------------------------------------
# 4. Settings that name what this machine or a path does not have: one line, before any file is
#    written


def every_script_with_a_device(tmp_path, device):
    """Each script that takes --device, run in-process with it: [(its name, the RunError it stopped
    with)], after asserting that it wrote nothing."""
    from tools import bench
    import distill
    import sample
    missing = tmp_path / 'missing'
    runs = {'train.py': lambda: train.main([f'--device={device}', f'--data_dir={missing}',
                                            f'--out_dir={tmp_path / "run"}']),
            'distill.py': lambda: distill.main([f'--device={device}', f'--teacher={missing}',
                                                f'--data_dir={missing}']),
            'eval_zeroshot.py': lambda: eval_zeroshot.main([
                f'--device={device}', f'--ckpt={missing}',
                f'--out={tmp_path / "eval" / "eval.json"}']),
            'analyze.py': lambda: analyze.main(['attention', str(missing),
                                                f'--out_dir={tmp_path / "analysis"}',
                                                f'--device={device}']),
            'tools/bench.py': lambda: bench.main([f'--device={device}']),
            'sample.py': lambda: sample.main([f'--device={device}', f'--ckpt={missing}'])}
    stopped = []
    for name, run in runs.items():
        with pytest.raises(errors.RunError) as e:
            run()
        stopped.append((name, str(e.value)))
    assert os.listdir(tmp_path) == []
    return stopped


def test_a_device_torch_cannot_use_is_one_line(tmp_path, monkeypatch):
    """--device=cuda with a CPU-only torch (torch would stop at the first tensor moved, 'Torch not
    compiled with CUDA enabled'), a GPU index this machine lacks, mps where there is none, a name
    that is no device."""
    # a CPU-only build, wherever this runs
    monkeypatch.setattr(torch.backends.cuda, 'is_built', lambda: False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    for name, message in every_script_with_a_device(tmp_path, 'cuda'):
        assert message == (f"--device=cuda: this torch ({torch.__version__}) was built without "
                           "CUDA: install a CUDA build of torch, or use --device=cpu (or auto: a "
                           "GPU where there is one)"), name
    monkeypatch.setattr(torch.backends.cuda, 'is_built', lambda: True)  # two GPUs
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    for name, message in every_script_with_a_device(tmp_path, 'cuda:7'):
        assert message == ("--device=cuda:7: this machine has 2 cuda devices (cuda:0 to cuda:1); "
                           "give one of them"), name
    monkeypatch.setattr(torch.mps, 'is_available', lambda: False)
    assert devices.resolve_device('cuda:1') == torch.device('cuda', 1)
    for device, message in [('mps', "--device=mps: torch sees no mps device here "
                                    "(torch.mps.is_available() is False); use --device=cpu (or "
                                    "auto: a GPU where there is one)"),
                            ('gpu', "--device=gpu: not a device name; use auto, cpu, cuda, cuda:N "
                                    "(N: a GPU's index) or mps")]:
        with pytest.raises(errors.RunError) as e:
            devices.resolve_device(device)
        assert str(e.value) == message


def test_compiling_on_a_cpu_without_a_cpp_compiler_is_one_line(data_dir, tmp_path):
    """--compile=True on CPU (the sink study's recipe) where no C++ compiler is found: TorchInductor
    would fail at the first step, deep in a traceback; train.py says it in one line before writing
    anything. In a child process, as a user meets it: TorchInductor's compiler list
    (torch._inductor.config.cpp.cxx) defaults to (None, $CXX), and setting it in the suite's process
    is state that can outlive the test: the config value is a ContextVar (per thread and context),
    and the compiler search is cached (cpp_builder.cpp_compiler_search, an lru_cache). A failed
    search in this process broke every later compile=True of the suite on another machine
    (docs/testing.md)."""
    env = dict(os.environ, CXX='no-such-c++-compiler')
    status, out, err = script('train.py', f'--data_dir={data_dir}', f'--out_dir={tmp_path / "run"}',
                              '--device=cpu', '--compile=True', env=env)
    assert status == 1 and out == ''
    assert one_line(err).startswith("train.py: error: compile=True on CPU needs a C++ compiler "
                                    "(TorchInductor builds C++): ")
    assert "no-such-c++-compiler" in err and err.rstrip().endswith(
        "Install g++ or clang++, or pass --compile=False (eager: about 1.2x slower in the sink "
        "study; docs/benchmarks.md)")
    assert not (tmp_path / 'run').exists()


def test_a_run_that_has_not_saved_yet_is_named_as_such(tmp_path, data_dir):
    """A train.py run directory holds config.json (and metrics.jsonl) from its start, ckpt.pt only
    from its first evaluation: given to a reader before then, it is named as such (not "model_type
    None is not supported")."""
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'config.json').write_text(json.dumps(train.load_config([f'--out_dir={run}'])))
    (run / 'metrics.jsonl').write_text('')
    said = (f"{run}: a train.py run directory with no ckpt.pt yet (a run saves it at every "
            "eval_interval steps and at its end); wait for its first save, or give a run that has "
            "one")
    with pytest.raises(checkpoint.CheckpointError, match=f"^{re.escape(said)}$"):
        # eval_zeroshot --ckpt, analyze attention, train/distill --teacher
        GPT.from_pretrained(str(run))
    with pytest.raises(checkpoint.CheckpointError, match=f"^{re.escape(said)}$"):
        # the dry run's plan reads the teacher's shape
        train.main(['--dry_run=True', f'--teacher={run}'])
    with pytest.raises(errors.RunError, match=f"^model {re.escape(str(run))}: {re.escape(said)}$"):
        eval_zeroshot.main([f'--ckpt={run}', '--tasks=heldout', f'--heldout_data={data_dir}',
                            f'--out={tmp_path / "e" / "r.json"}'])
    assert sorted(os.listdir(tmp_path)) == ['run']  # and no empty directory left for --out


def test_a_failed_start_leaves_no_empty_directory(tmp_path):
    """files.made_dirs, which eval_zeroshot.py (--out), export_hf.py and analyze.py make their
    outputs' directories with: what a failed run made is removed, as far up as it made it; a
    directory holding a file by then is kept."""
    with pytest.raises(errors.RunError):
        with files.made_dirs(tmp_path / 'a' / 'b' / 'c'):
            assert (tmp_path / 'a' / 'b' / 'c').is_dir()
            raise errors.RunError('the model does not load')
    assert os.listdir(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):
        with files.made_dirs(tmp_path / 'a' / 'b' / 'c'):
            (tmp_path / 'a' / 'notes.txt').write_text('written meanwhile')
            raise KeyboardInterrupt
    assert os.listdir(tmp_path / 'a') == ['notes.txt']  # b and c removed, a kept with the file
    with files.made_dirs(tmp_path / 'a' / 'b'):
        pass
    assert (tmp_path / 'a' / 'b').is_dir()  # kept when the block succeeds


def test_a_reader_that_stops_early_gets_no_error():
    """`python -m tools.bench --help | head -1` ended in "bench.py: error: a file: Broken pipe;
    check the path and the device": the reader stopping early is no fault of the path. Now it ends
    quietly, as Unix tools do (a script whose write meets a closed pipe), with the exit status a
    shell gives a writer SIGPIPE ended: 141 (issue 62: it was 1, as if it had failed)."""
    code = ("from lmkit.errors import run_script\n"
            "def main(argv):\n"
            "    raise BrokenPipeError(errno.EPIPE, 'Broken pipe')\n"
            "run_script(main)\n")
    run = subprocess.run([sys.executable, '-c', 'import errno\n' + code], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 141 and run.stderr == '' and run.stdout == ''
