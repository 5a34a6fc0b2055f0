"""Opening a checkpoint runs no code from it: every command that opens one refuses a ckpt.pt whose
pickle would run a command, in one line naming the file and what it held, and nothing in it runs;
every read goes through checkpoint.read_checkpoint. Checkpoints written before this (a fixture the
old code wrote) still load and resume bit for bit, also when they predate a config key."""
import ast
import glob
import json
import os
import shutil
import subprocess
import zipfile

import pytest
import torch

from lmkit import checkpoint
from lmkit import errors
import quickstart
import train
from lmkit import runs
from helpers import FIXTURE, FIXTURE_RUN, checkpoint_commands, fixture_data, refusal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return fixture_data(str(tmp_path_factory.mktemp('fixture_data') / 'data'))


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def resume(ckpt, data, out_dir, *extra):
    """train.py continuing the checkpoint `ckpt` (a dict) from out_dir to step 4; its records."""
    os.makedirs(out_dir)
    checkpoint.save_checkpoint(os.path.join(out_dir, 'ckpt.pt'), ckpt)
    train.main([*FIXTURE_RUN, f'--data_dir={data}', f'--out_dir={out_dir}', *extra])
    return records(os.path.join(out_dir, 'metrics.jsonl'))


def predated_note(path, ckpt):
    """The note for a checkpoint (a dict) lacking keys: those the fixture predates (added to
    train.py since its commit) and any deleted from it, in runs.KEYS' order, each with its
    default."""
    missing = [key for key in runs.KEYS if key not in {**ckpt['config'], **ckpt['model_config']}]
    return (f"note: {path} predates these keys, which take their defaults: "
            + ', '.join(f"{key}={runs.KEYS[key].default!r}" for key in missing))


# The fixture's numbers were recorded on one CPU. Another CPU orders float reductions differently
# (oneDNN/MKL pick kernels by SIMD width), so a resumed step can differ from the recording in the
# last bits of a float32 (5.553018569 against 5.553019047 seen on an AMD EPYC: 9e-8 relative).
# Relative 1e-5 allows that reordering (about 100 float32 ulps) and not what a wrong resume gives: a
# checkpoint taking a wrong default moved step 4 by 3.0e-5 and fails (docs/testing.md). Bit-for-bit
# resume, both runs on the same machine, is test_train.py's test_resume_is_bit_exact.
RTOL = 1e-5


def assert_continues_the_old_run(resumed):
    """The resumed steps 3-4 are the old code's uninterrupted run's, within what another CPU's float
    order changes."""
    old = records(os.path.join(FIXTURE, 'metrics.jsonl'))
    assert [r['step'] for r in resumed] == [3, 4]
    # the schedule: Python floats, exact anywhere
    assert [r['lr'] for r in resumed] == [r['lr'] for r in old[2:]]
    for key in ('loss', 'grad_norm'):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in old[2:]], rel=RTOL,
                                                          abs=0)
    assert resumed[-1]['val_loss'] == pytest.approx(old[-1]['val_loss'], rel=RTOL, abs=0)
    # alpha_ma is logged rounded to 5 decimals: a reordering may flip the last one
    assert resumed[-1]['alpha_ma'] == pytest.approx(old[-1]['alpha_ma'], rel=0, abs=1e-5)
    # a mean of logits near 0 (-2e-4, cancelling): relative to the scale of the logits it averages,
    # not to itself
    scale = old[-1]['attn_logit_abs_mean']
    assert resumed[-1]['attn_logit_mean'] == pytest.approx(old[-1]['attn_logit_mean'], rel=0,
                                                           abs=RTOL * scale)
    assert resumed[-1]['attn_logit_abs_mean'] == pytest.approx(scale, rel=RTOL, abs=0)

# -----------------------------------------------------------------------------
# Checkpoints written before: they load and resume


def test_a_checkpoint_of_the_old_code_resumes_and_continues_its_run(data, tmp_path, capsys):
    os.makedirs(tmp_path / 'run')
    # as it is, byte for byte
    shutil.copy(os.path.join(FIXTURE, 'ckpt.pt'), tmp_path / 'run' / 'ckpt.pt')
    train.main([*FIXTURE_RUN, f'--data_dir={data}', f'--out_dir={tmp_path / "run"}'])
    out, err = capsys.readouterr()
    assert out.startswith(f"init_from=auto: resuming from {tmp_path / 'run' / 'ckpt.pt'} at step "
                          "2\n")
    ckpt = checkpoint.read_checkpoint(os.path.join(FIXTURE, 'ckpt.pt'), keys=checkpoint.CKPT_KEYS)
    # keys added since
    if any(key not in {**ckpt['config'], **ckpt['model_config']} for key in runs.KEYS):
        assert [line for line in err.splitlines() if 'predates' in line] == [
            predated_note(tmp_path / 'run' / 'ckpt.pt', ckpt)]
    else:
        assert 'predates' not in err
    assert_continues_the_old_run(records(tmp_path / 'run' / 'metrics.jsonl'))


def test_a_key_added_since_a_checkpoint_takes_its_default(data, tmp_path, capsys):
    """A checkpoint lacking keys (as one written before they existed): they take their defaults,
    with one line that says so, and the run continues bit for bit; a value other than the default is
    a change like any other."""
    ckpt = checkpoint.read_checkpoint(os.path.join(FIXTURE, 'ckpt.pt'), keys=checkpoint.CKPT_KEYS)
    del ckpt['config']['kd_loss'], ckpt['config']['affine_bias_norm']
    del ckpt['model_config']['affine_bias_norm']
    path = tmp_path / 'run' / 'ckpt.pt'
    resumed = resume(ckpt, data, tmp_path / 'run')
    notes = [line for line in capsys.readouterr().err.splitlines() if 'predates' in line]
    assert notes == [predated_note(path, ckpt)]
    assert "kd_loss='fused'" in notes[0] and "affine_bias_norm='seq_len'" in notes[0]
    assert_continues_the_old_run(resumed)
    del ckpt['config']['kd_alpha']
    with pytest.raises(errors.RunError, match=r"kd_alpha: 1\.0 -> 0\.5"):
        resume(ckpt, data, tmp_path / 'changed', '--kd_alpha=0.5')


def test_numpy_1x_names_of_the_rng_state_load(tmp_path, monkeypatch):
    """numpy 1.x pickles its arrays with numpy.core.multiarray._reconstruct (numpy 2:
    numpy._core...)."""
    ckpt = checkpoint.read_checkpoint(os.path.join(FIXTURE, 'ckpt.pt'), keys=checkpoint.CKPT_KEYS)
    # what numpy 1.x names it
    monkeypatch.setattr(checkpoint._RECONSTRUCT, '__module__', 'numpy.core.multiarray')
    path = str(tmp_path / 'ckpt.pt')
    torch.save(ckpt, path)
    monkeypatch.undo()
    with zipfile.ZipFile(path) as archive:
        assert b'cnumpy.core.multiarray\n_reconstruct\n' in archive.read('ckpt/data.pkl')
    state = checkpoint.read_checkpoint(path, keys=checkpoint.CKPT_KEYS)['rng']['numpy']
    assert state[0] == 'MT19937' and (state[1] == ckpt['rng']['numpy'][1]).all()
    assert state[2:] == ckpt['rng']['numpy'][2:]

# -----------------------------------------------------------------------------
# A checkpoint that would run code: refused by every command, in one line, and nothing runs


class Hostile:
    """Unpickled, it creates the file `marker` (as any command a shared ckpt.pt could run)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


@pytest.fixture
def hostile(tmp_path):
    """(a run directory whose ckpt.pt would create marker if unpickled, marker, what the refusal
    names)."""
    run, marker = tmp_path / 'hostile', tmp_path / 'ran'
    run.mkdir()
    # every key a checkpoint has, and valid ones at that: only the pickled call is wrong
    ckpt = checkpoint.read_checkpoint(os.path.join(FIXTURE, 'ckpt.pt'), keys=checkpoint.CKPT_KEYS)
    torch.save(dict(ckpt, step=Hostile(marker)), run / 'ckpt.pt')
    return run, marker, (f"{run / 'ckpt.pt'} is refused: it holds code, not only data: the global "
                         f"'{os.system.__module__}.system'")


def test_every_command_refuses_a_checkpoint_that_would_run_code(hostile, data, tmp_path, capsys,
                                                                monkeypatch):
    run, marker, message = hostile
    for name, main, argv in checkpoint_commands(run, data, tmp_path):
        line = refusal(capsys, main, argv)
        assert message in line and 'Nothing in it was run' in line, (name, line)
    # the quick start's check of a stage's checkpoint (its own out_dir/teacher), with no install and
    # no stage run
    monkeypatch.setattr(quickstart, 'install', lambda *args: True)
    monkeypatch.setattr(quickstart.children, 'start', lambda command,
                        **how: subprocess.Popen(['true'], **how))
    shutil.copytree(run, tmp_path / 'quickstart' / 'teacher')
    line = refusal(capsys, quickstart.main,
                   [f'--out_dir={tmp_path / "quickstart"}', f'--data_dir={data}',
                    '--real_model=False'])
    assert (f"{tmp_path / 'quickstart' / 'teacher' / 'ckpt.pt'} is refused: it holds code"
            in line), line
    assert not marker.exists()
    assert sorted(os.listdir(run)) == ['ckpt.pt']  # and the resume wrote nothing beside it


def test_the_refusal_comes_before_anything_unpickles_it(hostile, monkeypatch):
    """Neither torch.load nor the checksum pass's unpickler sees such a file; the checksum pass
    alone refuses it too, and so does torch.load(weights_only=True) where the scan would miss it."""
    run, marker, message = hostile
    path = str(run / 'ckpt.pt')

    def unpickled(*args, **kwargs):
        raise AssertionError("unpickled")
    with monkeypatch.context() as m:
        m.setattr(checkpoint.torch, 'load', unpickled)
        m.setattr(checkpoint._TensorsAsRecords, 'load', unpickled)
        with pytest.raises(checkpoint.CheckpointError, match='is refused'):
            checkpoint.read_checkpoint(path)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.verify_checkpoint(path, checkpoint.CKPT_KEYS)
    assert message in str(e.value)
    monkeypatch.setattr(checkpoint, 'code_in', lambda pickled: [])
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(path)
    assert (f"{path} is refused: it holds what torch.load(weights_only=True) refuses "
            "(" in str(e.value))
    assert '\n' not in str(e.value) and 'weights_only=False' not in str(e.value)
    assert not marker.exists()


def test_other_forms_of_a_pickled_call_are_refused_by_name(tmp_path):
    """Protocol 4's STACK_GLOBAL (which torch.save never writes), and a global no checkpoint names
    even where torch's own allowlist has it."""
    marker = tmp_path / 'ran'
    for name, obj, protocol in [('posix.system', Hostile(marker), 4),
                                ('torch.device', torch.device('cpu'), 2)]:
        path = str(tmp_path / f'{protocol}.pt')
        torch.save(dict(model={}, model_config={}, tokenizer=obj), path, pickle_protocol=protocol)
        with pytest.raises(checkpoint.CheckpointError,
                           match="is refused: it holds code, not only data: the global "
                                 f"'{name.replace('posix', os.system.__module__)}'"):
            checkpoint.read_checkpoint(path)
    assert not marker.exists()


def test_every_checkpoint_read_goes_through_read_checkpoint():
    """No script reads a pickle itself: torch.load and pickle's loaders are called only in
    checkpoint.py, and torch.load there with weights_only=True."""
    calls = []
    folders = ('', 'lmkit', 'study', 'tools', 'scripts')
    for path in [p for folder in folders for p in glob.glob(os.path.join(ROOT, folder, '*.py'))]:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func) in ('torch.load', 'pickle.load', 'pickle.loads',
                                                   'pickle.Unpickler',
                                                   'torch.serialization.load', 'np.load',
                                                   'numpy.load'):
                calls.append((os.path.basename(path), ast.unparse(node)))
    assert [name for name, _ in calls] == ['checkpoint.py'], calls
    assert 'weights_only=True' in calls[0][1]
