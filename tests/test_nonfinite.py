"""No weights that are not finite are saved, and none are read: train.py stops before it would save
the weights of a step whose update made them NaN (its loss and gradient norm finite, so the guard
before the update let it pass), or a non-finite validation loss, keeping the last good checkpoints;
and every command that reads a model from a checkpoint refuses one with NaN weights, in one line
naming the file and the first such tensor (checkpoint.read_checkpoint)."""
import math
import os
import re

import pytest

from lmkit import checkpoint
import train
from lmkit.errors import RunError
from helpers import FIXTURE, checkpoint_commands, fixture_data, metrics, refusal, tiny_args


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return fixture_data(str(tmp_path_factory.mktemp('fixture_data') / 'data'))


def saved_step(path):
    # (and its weights finite)
    ckpt = checkpoint.read_checkpoint(str(path), keys=checkpoint.CKPT_KEYS)
    return ckpt['step']


@pytest.mark.parametrize('nonfinite', ['stop', 'skip'])
def test_a_step_that_makes_the_weights_nan_is_not_saved(data_dir, tmp_path, monkeypatch, nonfinite):
    """The issue's --learning_rate=1e999 (an infinite rate, which the key's range now refuses) from
    step 3 on: step 3's loss and gradient norm are those of step 2's finite weights, its update
    writes NaN. Before, step 3 was saved (43 of 173 tensors NaN in the tiny_cpu model); now the run
    stops there, and ckpt.pt (step 2) and ckpt.prev.pt (step 1) stay. nonfinite='skip' cannot skip
    it: the update has happened."""
    schedule = train.learning_rate
    monkeypatch.setattr(train, 'learning_rate', lambda step, c: math.inf if step >= 2
                        else schedule(step, c))
    run = tmp_path / 'run'
    with pytest.raises(RunError) as e:
        train.main(tiny_args(data_dir, run, '--max_iters=4', '--eval_interval=1',
                             f'--nonfinite={nonfinite}'))
    message = str(e.value)
    assert re.match(r"step 3: the weights are not finite after the optimizer step: \d+ of the "
                    r"model's \d+ float "
                    r"tensors hold NaN or infinity, the first model\.embed_tokens\.weight; "
                    r"stopping without saving: ", message) and '\n' not in message
    assert (f"({run / 'ckpt.pt'}: step 2)" in message
            and '--learning_rate=<lower> --resume_lr_change=True' in message)
    assert saved_step(run / 'ckpt.pt') == 2 and saved_step(run / 'ckpt.prev.pt') == 1
    assert [r['step'] for r in metrics(run)] == [1, 2,
                                                 3] and math.isnan(metrics(run)[-1]['val_loss'])


def test_a_non_finite_validation_loss_is_not_saved(data_dir, tmp_path, monkeypatch):
    """Finite weights whose validation loss is not (an overflow in the forward): not saved either;
    this run saved nothing before, and the line says so."""
    monkeypatch.setattr(train, 'validation_loss', lambda *args, **kwargs: math.inf)
    with pytest.raises(RunError) as e:
        train.main(tiny_args(data_dir, tmp_path, '--max_iters=1'))
    assert str(e.value) == ("step 1: the validation loss is inf (the weights are finite); stopping "
                            "without saving: this run saved no checkpoint before it; start again "
                            "with a lower --learning_rate")
    assert not (tmp_path / 'ckpt.pt').exists()


def test_an_infinite_learning_rate_is_refused_before_any_work(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(tiny_args(data_dir, tmp_path / 'run', '--learning_rate=1e999'))
    assert (e.value.code == 2 and str(e.value) == '--learning_rate=inf is out of range: must be in '
                                                  '(0, 1]')
    assert not (tmp_path / 'run').exists()


@pytest.fixture
def nan_run(tmp_path):
    """A run directory whose ckpt.pt is the fixture's checkpoint with one tensor turned NaN (as a
    diverged run's would be), and the name of that tensor."""
    ckpt = checkpoint.read_checkpoint(os.path.join(FIXTURE, 'ckpt.pt'), keys=checkpoint.CKPT_KEYS)
    name = 'model.layers.0.mlp.up_proj.weight'
    model = {key: t.clone() for key, t in ckpt['model'].items()}
    model[name][0, 0] = math.nan
    (tmp_path / 'nan').mkdir()
    checkpoint.save_checkpoint(str(tmp_path / 'nan' / 'ckpt.pt'), dict(ckpt, model=model))
    return tmp_path / 'nan', name, len(model)


def test_every_command_refuses_a_checkpoint_with_nan_weights(nan_run, data, tmp_path, capsys):
    """eval_zeroshot.py used to report an accuracy and exit 0, sample.py to print NUL bytes (or a
    torch.multinomial traceback), analyze.py a numpy traceback, export_hf.py to export it, and a
    resume to train on from it."""
    run, name, count = nan_run
    said = (f"{run / 'ckpt.pt'} holds weights that are not finite: 1 of its {count} float tensors "
            f"hold NaN or infinity, the first {name} (a run that diverged); nothing was loaded "
            "from it")
    commands = {command: (main, argv) for command, main,
                argv in checkpoint_commands(run, data, tmp_path)}
    # the plan reads the teacher's shape, not its weights
    main, argv = commands.pop('train.py --dry_run --teacher')
    main(argv)
    assert capsys.readouterr().out.startswith('params: ')
    assert {'eval_zeroshot.py --ckpt', 'analyze.py attention', 'sample.py --ckpt',
            'export_hf.py --ckpt', 'a resume'} <= set(commands)
    for command, (main, argv) in commands.items():
        assert said in refusal(capsys, main, argv), command
    # nothing written
    assert sorted(os.listdir(run)) == ['ckpt.pt'] and sorted(os.listdir(tmp_path)) == ['nan']
