"""configurator.py: the one configurator every script uses (the forms a command line takes, and its
errors)."""
import pytest

from configurator import Key, parse

KEYS = dict(
    name=Key('a', "a string"),
    steps=Key(10, "at least 1", min=1),
    rate=1e-3,  # a bare default is a key of its type
    share=Key(0.5, min=0, max=1),
    momentum=Key(0.9, min=0, below=1),
    temperature=Key(1.0, above=0),
    flag=False,
    mode=Key('fast', choices=('fast', 'slow')),
    items=Key(['x', 'y'], choices=('x', 'y', 'z')),
    sizes=Key([1, 2], min=1),
    limit=Key(None, types=(int,)),
    out=Key(None, types=(str,), required=True),
)


def error(argv, capsys, **kw):
    with pytest.raises(SystemExit) as e:
        parse(argv, KEYS, **kw)
    assert e.value.code == 2  # argparse's status
    err = capsys.readouterr().err
    # one line, also on stderr after the usage line
    assert str(e.value) in err and '\n' not in str(e.value)
    assert err.startswith('usage:') and '--steps' in err
    return str(e.value)


def test_defaults_and_both_override_forms():
    c = parse(['--out=o', '--steps=3', '--name', 'b', '--rate=1', '--limit=None'], KEYS)
    assert c == dict(name='b', steps=3, rate=1.0, share=0.5, momentum=0.9, temperature=1.0,
                     flag=False, mode='fast', items=['x', 'y'], sizes=[1, 2], limit=None, out='o')
    assert isinstance(c['rate'], float)  # an int is widened where a float is expected
    assert parse(['--out=123'], KEYS)['out'] == '123'  # a string key takes its text as written


def test_bool_flags_and_comma_lists():
    assert parse(['--out=o', '--flag'], KEYS)['flag'] is True
    assert parse(['--out=o', '--flag', 'False'], KEYS)['flag'] is False
    for text, value in [('True', True), ('false', False), ('1', True), ('0', False)]:
        assert parse(['--out=o', f'--flag={text}'], KEYS)['flag'] is value
    c = parse(['--out=o', '--items=z,x', '--sizes=1024,2048'], KEYS)
    assert c['items'] == ['z', 'x'] and c['sizes'] == [1024, 2048]


def test_config_files_and_positional_lists(tmp_path, capsys):
    path = tmp_path / 'c.py'
    path.write_text("# a comment\nsteps = 5\nname = 'file'\n")
    c = parse([str(path), '--name=cli'], KEYS | dict(out='o'), files=True)
    assert c['steps'] == 5 and c['name'] == 'cli'  # the override after the file wins
    c = parse(['p1', '--out=o', 'p2'], KEYS, positional='paths')
    assert c['paths'] == ['p1', 'p2']
    assert 'required: paths' in error(['--out=o'], capsys, positional='paths')
    assert 'unrecognized arguments: stray' in error(['stray', '--out=o'], capsys)
    path.write_text("bogus = 1\n")
    assert "unknown config key 'bogus'; valid keys: " in error([str(path)], capsys, files=True)
    assert 'overrides are written --key=value' in error(['--steps', '5'], capsys, files=True)


def test_expands_sets_other_keys_where_it_stands():
    keys = dict(KEYS,
                shape=Key(None, types=(str,), choices=('big',),
                          expands=dict(big=dict(steps=100, name='B'))))
    c = parse(['--steps=3', '--shape=big', '--name=mine', '--out=o'], keys)
    assert c['shape'] == 'big' and c['steps'] == 100 and c['name'] == 'mine'


@pytest.mark.parametrize('argv, message', [
    (['--nope=1'],
     "unrecognized arguments: --nope=1 (unknown config key 'nope'); valid keys: --flag, --items, "),
    (['--steps=two'], "steps='two' has type str, expected int (invalid int value: 'two')"),
    (['--steps=1.5'], 'steps=1.5 has type float, expected int'),
    (['--flag=maybe'], "flag='maybe' has type str, expected bool"),
    (['--mode=slower'], "invalid choice: mode='slower'; valid values: fast, slow"),
    (['--items=x,w'], 'unknown w; choose from x, y, z'),
    (['--sizes=1,a'], "expected comma-separated int values, got '1,a'"),
    (['--steps=0'], '--steps=0 is out of range: must be >= 1'),
    (['--share=1.5'], '--share=1.5 is out of range: must be in [0, 1]'),
    (['--share', '-1'], '--share=-1.0 is out of range: must be in [0, 1]'),
    (['--momentum=1'], '--momentum=1.0 is out of range: must be in [0, 1)'),
    (['--temperature=0'], '--temperature=0.0 is out of range: must be > 0'),
    (['--sizes=4,0'], '--sizes=4,0 is out of range: each must be >= 1'),
    (['--steps'], 'argument --steps: expected one argument'),
])
def test_errors_are_one_line_naming_key_value_and_expectation(argv, message, capsys):
    assert message in error(['--out=o', *argv], capsys)


def test_a_key_of_strings_and_bools_reads_both(tmp_path, capsys):
    """A key whose types include bool beside its default's (train.py's gate: a bool before it took
    names): True/False texts are bools, a bare flag is True, other text is a string; its choices
    hold both, and None is refused where it is not a choice of a key with a default."""
    keys = KEYS | dict(kind=Key('none', choices=('none', 'one', True, False), types=(str, bool)))
    for argv, value in [([], 'none'), (['--kind=one'], 'one'), (['--kind=True'], True),
                        (['--kind'], True), (['--kind', 'False'], False), (['--kind=0'], False)]:
        assert parse(['--out=o', *argv], keys)['kind'] == value
    path = tmp_path / 'c.py'
    for text, value in [("'one'", 'one'), ('True', True)]:
        path.write_text(f"kind = {text}\n")
        assert parse([str(path), '--out=o'], keys, files=True)['kind'] == value
    for argv, shown in [(['--kind=two'], "'two'"), (['--kind=None'], 'None')]:
        with pytest.raises(SystemExit) as e:
            parse(['--out=o', *argv], keys)
        assert str(e.value) == (f"{argv[0]}: invalid choice: kind={shown}; valid values: none, "
                                "one, True, False")


def test_required(capsys):
    assert 'the following arguments are required: --out' in error(['--steps=2'], capsys)


def test_help_lists_every_key_with_its_default_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        parse(['--help'], KEYS, "What the script does.")
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert 'What the script does.' in out
    assert "--steps" in out and 'default 10; at least 1; >= 1' in out and 'one of fast, slow' in out
    assert ('default 0.9; in [0, 1)' in out and 'default 1.0; > 0' in out
            and 'default 1,2; >= 1' in out)
    assert '--out' in out and 'required' in out and 'default x,y' in out


def test_range_edges_are_accepted_and_a_config_file_is_named(tmp_path, capsys):
    c = parse(['--out=o', '--steps=1', '--share=0', '--momentum=0', '--temperature=1e-9',
               '--sizes=1,1'], KEYS)
    assert (c['steps'], c['share'], c['momentum'], c['temperature'], c['sizes']) == (1, 0.0, 0.0,
                                                                                     1e-9, [1, 1])
    assert parse(['--out=o', '--share=1'], KEYS)['share'] == 1.0
    path = tmp_path / 'c.py'
    path.write_text("temperature = -2\n")
    assert error([str(path)], capsys,
                 files=True) == f"{path}: --temperature=-2.0 is out of range: must be > 0"


def test_rules_hold_once_every_key_is_set(capsys):
    rules = ('share <= momentum',)
    # share=0.95 exceeds the default momentum until --momentum=0.99 follows: a rule is checked at
    # the end
    assert parse(['--out=o', '--share=0.95', '--momentum=0.99'], KEYS, rules=rules)['share'] == 0.95
    message = error(['--out=o', '--share=0.95'], capsys, rules=rules)
    assert message == '--share=0.95 --momentum=0.9: must have share <= momentum'
    with pytest.raises(SystemExit):
        parse(['--help'], KEYS, rules=rules)
    assert 'must hold: share <= momentum' in capsys.readouterr().out


@pytest.mark.parametrize('source, line, what', [
    ("steps = 5\nname = ('b'\n", 2, "'(' was never closed"),  # a syntax error
    # the file runs and raises
    ("steps = 5\n\nrate = 1 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("def f():\n    return undefined\nsteps = f()\n", 2,
     "NameError: name 'undefined' is not defined"),
    # written in Latin-1
    ("name = 'caf\xe9'\n", 1, "(unicode error) 'utf-8' codec can't decode byte 0xe9"),
])
def test_a_config_file_that_does_not_run_is_named_with_its_line(source, line, what, tmp_path,
                                                                capsys):
    path = tmp_path / 'c.py'
    path.write_bytes(source.encode('latin-1'))
    message = error([str(path)], capsys, files=True)
    assert message.startswith(
        f"{path}, line {line}: {what}") and message.endswith(
        "; a config file is Python: fix that line")
