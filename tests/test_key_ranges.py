"""Every numeric key of every script declares its valid range where it is declared, and each
script's own parse refuses a value outside it in one line (exit status 2) before any work starts
(issue 22)."""
import os
import subprocess
import sys

import pytest

import analyze
from tools import bench
import distill
import eval_zeroshot
import export_hf
from tools import gpu_check
import model
import prepare_data
import quickstart
import sample
import train
from lmkit import runs
from configurator import Key, bounds, parse, shown

ROOT = os.path.join(os.path.dirname(__file__), '..')
TINY = os.path.join(ROOT, 'config', 'tiny_cpu.py')

# script: (its key dict, how it parses a command line, the arguments it requires)
SCRIPTS = {
    'train': (runs.KEYS, train.load_config, []),
    'distill': (distill.KEYS, distill.parse_args, ['--teacher=t', '--data_dir=d']),
    'eval_zeroshot': (eval_zeroshot.KEYS, eval_zeroshot.parse_args, ['--ckpt=c']),
    'prepare_data': (prepare_data.KEYS, prepare_data.parse_args, ['--out_dir=o']),
    'export_hf': (export_hf.KEYS, export_hf.parse_args, ['--ckpt=c', '--out_dir=o']),
    'bench': (bench.KEYS, bench.parse_args, []),
    'sample': (sample.KEYS, sample.parse_args, ['--ckpt=c']),
    'gpu_check': (gpu_check.KEYS, gpu_check.parse_args, []),
    'quickstart': (quickstart.KEYS, lambda argv: parse(argv, quickstart.KEYS, prog='quickstart.py'),
                   []),
    **{'analyze '
       f'{job}': (keys, lambda argv, keys=keys, positional=positional, what=what,
                  rules=rules: parse(
        argv, keys, what, positional, prog='analyze.py', rules=rules), ['run', '--out_dir=o'])
       for job, (keys, positional, what, rules) in analyze.JOBS.items()},
}


def numeric(key):
    """Whether a key takes numbers (a list key: its elements); bools are not numbers here."""
    kind = type(key.default[0]) if isinstance(key.default,
                                              list) and key.default else type(key.default)
    return bool({kind, *key.types} & {int, float})


def declared(keys):
    """name -> Key, a bare default (which the configurator allows) as the Key it stands for: one
    with no range."""
    return {name: key if isinstance(key, Key) else Key(key) for name, key in keys.items()}


NUMERIC = [(script, name, key) for script, (keys, _, _) in SCRIPTS.items() for name,
           key in declared(keys).items() if numeric(key)]


def config_of(script, argv):
    _, parse_argv, required = SCRIPTS[script]
    result = parse_argv(required + argv)
    return result if isinstance(result, dict) else vars(result)


def refused(script, argv, capsys):
    """The one-line error the script's parse gives for argv, after its usage line on stderr, exit
    status 2."""
    _, parse_argv, required = SCRIPTS[script]
    with pytest.raises(SystemExit) as e:
        parse_argv(required + argv)
    message, err = str(e.value), capsys.readouterr().err
    assert e.value.code == 2 and '\n' not in message
    assert (err.startswith('usage: ') and err.endswith(f"\nerror: {message}\n")
            and err.count('\n') == 2)
    return message


def outside(key):
    """A value beyond each bound the key declares."""
    return [value for value in (key.min - 1 if key.min is not None else None, key.above,
                                key.max + 1 if key.max is not None else None, key.below)
            if value is not None]


def test_every_numeric_key_has_a_lower_bound():
    assert {script for script, _, _ in NUMERIC} >= set(SCRIPTS) - {'export_hf', 'analyze table'}
    assert [(script, name) for script, name, key in NUMERIC if key.min is None
            and key.above is None] == []


@pytest.mark.parametrize('script,name,key', NUMERIC,
                         ids=[f'{script}:{name}' for script, name, _ in NUMERIC])
def test_out_of_range_is_refused_in_one_line_and_in_range_is_accepted(script, name, key, capsys):
    for bad in outside(key):
        message = refused(script, [f'--{name}={bad}'], capsys)
        assert (message.startswith(f'--{name}=') and 'is out of range: ' in message
                and bounds(key) in message)
    good = (key.default if key.default is not None else key.min if key.min is not None
            else key.above + 1)
    assert config_of(script, [f'--{name}={shown(good)}'])[name] == good


# train.py accepted all of these before, or failed deep inside torch
@pytest.mark.parametrize('argv,message', [
    (['--min_lr=-0.001'], '--min_lr=-0.001 is out of range: must be >= 0'),
    (['--kd_alpha=1.5'], '--kd_alpha=1.5 is out of range: must be in [0, 1]'),
    (['--kd_temperature=0'], '--kd_temperature=0.0 is out of range: must be in (0, 100]'),
    (['--grad_clip=-1'], '--grad_clip=-1.0 is out of range: must be >= 0'),
    (['--warmup_iters=-3'], '--warmup_iters=-3 is out of range: must be >= 0'),
    (['--decay_frac=1.5'], '--decay_frac=1.5 is out of range: must be in [0, 1]'),
    (['--learning_rate=-0.001'], '--learning_rate=-0.001 is out of range: must be in (0, 1]'),
    (['--beta2=1'], '--beta2=1.0 is out of range: must be in [0, 1)'),
    (['--max_iters=0'], '--max_iters=0 is out of range: must be >= 1'),
    (['--dry_run=True', '--dry_run_world_size=0'],
     '--dry_run_world_size=0 is out of range: must be >= 1'),
    (['--dry_run=True', '--dry_run_gpu_gib=0'],
     '--dry_run_gpu_gib=0.0 is out of range: must be > 0'),
    (['--rms_norm_eps=0'], '--rms_norm_eps=0.0 is out of range: must be in (0, 0.001]'),
    # accepted before, and trained to a finite but meaningless loss (issue 43), or a NaN checkpoint
    (['--learning_rate=1e999'], '--learning_rate=inf is out of range: must be in (0, 1]'),
    (['--learning_rate=2'], '--learning_rate=2.0 is out of range: must be in (0, 1]'),
    (['--rope_theta=1e999'], '--rope_theta=inf is out of range: must be in (1, 1000000000.0]'),
    (['--rope_theta=1'], '--rope_theta=1.0 is out of range: must be in (1, 1000000000.0]'),
    (['--rms_norm_eps=1e30'], '--rms_norm_eps=1e+30 is out of range: must be in (0, 0.001]'),
    (['--kd_temperature=1e999'], '--kd_temperature=inf is out of range: must be in (0, 100]'),
    # torch.manual_seed's OverflowError, a traceback, before
    (['--seed=99999999999999999999'],
     '--seed=99999999999999999999 is out of range: must be in [0, 18446744073709551615]'),
    (['--min_lr=0.01'], '--min_lr=0.01 --learning_rate=0.001: must have min_lr <= learning_rate'),
    # (issue 53) "a file: no such file or directory", naming neither the flag nor the path
    (['--out_dir='], "--out_dir=: must have out_dir != ''"),
    (['--min_lr=1e-4', '--learning_rate=1e-5'],
     '--min_lr=0.0001 --learning_rate=1e-05: must have min_lr <= learning_rate'),
])
def test_train_refuses_what_it_used_to_accept(argv, message, capsys):
    assert refused('train', [TINY, *argv], capsys) == message


def test_train_accepts_the_edges_of_each_range():
    edges = dict(min_lr=0.0, warmup_iters=0, decay_frac=1.0, weight_decay=0.0, beta1=0.0,
                 grad_clip=0.0, kd_alpha=0.0, seed=0, max_iters=1, affine_momentum=1.0)
    c = config_of('train', [TINY, *[f'--{k}={v}' for k, v in edges.items()]])
    assert {k: c[k] for k in edges} == edges
    # a rule is checked once every key is set: min_lr may be written before the learning_rate it
    # stays under
    assert config_of('train', ['--min_lr=0.01', '--learning_rate=0.1'])['min_lr'] == 0.01
    assert config_of('train', ['--min_lr=0.01', '--learning_rate=0.01'])['min_lr'] == 0.01


def test_the_upper_bounds_are_accepted_and_every_published_shape_passes():
    edges = dict(learning_rate=1.0, seed=2 ** 64 - 1, kd_temperature=100.0, rope_theta=1e9,
                 rms_norm_eps=1e-3)
    c = config_of('train', [TINY, *[f'--{k}={v}' for k, v in edges.items()]])
    assert {k: c[k] for k in edges} == edges
    # their rope_theta (1e4 to 1e6) and rms_norm_eps (1e-6, 1e-5)
    for shape, fields in model.MODEL_SHAPES.items():
        c = config_of('train', [f'--model={shape}'])
        assert {k: c[k] for k in fields} == fields, shape


def test_config_files_are_checked_like_overrides(tmp_path, capsys):
    path = tmp_path / 'bad.py'
    path.write_text("kd_alpha = 2\n")
    assert refused('train', [str(path)],
                   capsys) == f"{path}: --kd_alpha=2.0 is out of range: must be in [0, 1]"


@pytest.mark.parametrize('window', ['500,0', '100,100', '0,100,200'])
def test_analyze_runs_window_is_start_before_end(window, capsys):
    message = refused('analyze runs', [f'--window={window}'], capsys)
    assert message == f'--window={window}: must have len(window) == 2 and window[0] < window[1]'
    assert config_of('analyze runs', ['--window=0,100'])['window'] == [0, 100]


def test_a_size_parsed_later_fails_in_one_line_too(capsys):
    with pytest.raises(SystemExit) as e:
        export_hf.parse_args(['--ckpt=c', '--out_dir=o', '--max_shard_size=5 parsecs'])
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {e.value}\n"
    assert str(e.value).startswith('--max_shard_size=5 parsecs: expected a size')
    assert config_of('export_hf', ['--max_shard_size=500MB'])['max_shard_size'] == 500_000_000
    with pytest.raises(SystemExit) as e:  # (issue 53) 0 wrote one shard per tensor
        export_hf.parse_args(['--ckpt=c', '--out_dir=o', '--max_shard_size=0'])
    assert str(e.value) == '--max_shard_size=0 is out of range: must be > 0 bytes'


def test_sample_refuses_an_infinite_temperature(capsys):
    """Issue 53: --temperature=1e999 sampled uniformly, special ids included; it is out of range
    now."""
    message = refused('sample', ['--temperature=1e999'], capsys)
    assert message == '--temperature=inf is out of range: must be in [0, 100]'
    assert config_of('sample', ['--temperature=100'])['temperature'] == 100.0


def test_help_shows_the_ranges_and_rules(capsys):
    with pytest.raises(SystemExit):
        train.load_config(['--help'])
    out = capsys.readouterr().out
    assert 'in [0, 1]' in out and '> 0' in out and 'must hold: min_lr <= learning_rate' in out
    with pytest.raises(SystemExit):
        SCRIPTS['analyze runs'][1](['--help'])
    assert 'must hold: len(window) == 2' in capsys.readouterr().out


@pytest.mark.parametrize('arg,error', [
    ('--learning_rate=-0.001', '--learning_rate=-0.001 is out of range: must be in (0, 1]'),
    # before: torch.manual_seed's traceback (RuntimeError: Overflow when unpacking long)
    ('--seed=99999999999999999999',
     '--seed=99999999999999999999 is out of range: must be in [0, 18446744073709551615]'),
])
def test_train_command_line_prints_one_error_line_not_a_traceback(arg, error):
    proc = subprocess.run([sys.executable, 'train.py', arg], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stdout == ''
    usage, line = proc.stderr.splitlines()
    assert usage.startswith('usage: train.py') and line == f'error: {error}'

