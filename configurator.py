"""The one configurator every script uses. A script declares its keys (name -> default or Key) and
the rules that tie them, and a command line becomes a dict of checked values: the defaults, then
config files, then overrides (docs/training.md, "Configuration"), then the rules. Pure Python:
quickstart.py parses its flags before torch is installed."""
import ast
import copy
import os
import sys
import traceback
from dataclasses import dataclass

BOOLS = {'True': True, 'true': True, '1': True, 'yes': True, 'False': False, 'false': False,
         '0': False, 'no': False}


@dataclass
class Key:
    default: object
    help: str = ''
    choices: tuple = None  # the values it may take (a list key: each element)
    min: float = None  # the range (a list key: each element's): min <= value <= max,
    max: float = None
    above: float = None  # and above < value < below, where the bound itself is invalid
    below: float = None
    types: tuple = ()  # the types it may take, and None (not with choices and a default)
    required: bool = False  # must be given (not None)
    expands: dict = None  # value -> {key: value, ...}: setting this key sets those, there and then
    unique: bool = False  # a list key: each element at most once (a repeat would mean nothing)


DEVICE = Key('auto', "auto (cuda if available), cpu, cuda, cuda:1, ...")


def fail(message, usage=''):
    """argparse's way out: usage and message on stderr, exit status 2."""
    print(f"{usage}error: {message}", file=sys.stderr)
    error = SystemExit(message)
    error.code = 2
    raise error


def parse(argv, keys, doc='', positional=None, files=False, prog=None, rules=()):
    """The checked config (a dict) of argv, for `keys` (name -> default or Key). Bare arguments are
    the list `positional` names, or config files (files=True), or errors. rules: expressions that
    must hold once every key is set, e.g. 'min_lr <= learning_rate'."""
    keys = {name: key if isinstance(key, Key) else Key(key) for name, key in keys.items()}
    bare = f' {positional} ...' if positional else ' [config files]' if files else ''
    flags = ' '.join(f"--{n}=..." if k.required else f"[--{n}=...]" for n, k in keys.items())
    usage = f"usage: {prog or os.path.basename(sys.argv[0])}{bare} {flags}\n"
    config, found, args = {name: key.default for name, key in keys.items()}, [], list(argv)

    def set_value(name, value, where):
        config[name] = check(name, keys[name], value, where, usage)
        if keys[name].expands and config[name] is not None:
            for sub, sub_value in copy.deepcopy(keys[name].expands[config[name]]).items():
                config[sub] = check(sub, keys[sub], sub_value, where, usage)

    while args:
        arg = args.pop(0)
        if arg in ('-h', '--help'):
            print(usage + '\n' + doc.strip('\n') + '\n\n'
                  + '\n'.join(describe(n, k) for n, k in keys.items())
                  + ''.join(f"\n  must hold: {rule}" for rule in rules))
            raise SystemExit(0)
        if arg.startswith('--'):
            name, sep, text = arg[2:].partition('=')
            if name not in keys:
                fail(f"unrecognized arguments: {arg} (unknown config key {name!r}); valid keys: "
                     f"{', '.join('--' + n for n in sorted(keys))}", usage)
            if not sep:  # --key value, or a bool flag alone
                if bool in (type(keys[name].default),) + keys[name].types:
                    text = args.pop(0) if args and args[0] in BOOLS else 'True'
                elif files:  # a bare word after it would be a config file
                    fail(f"{arg}: overrides are written --key=value", usage)
                elif not args or args[0].startswith('--'):
                    fail(f"argument {arg}: expected one argument", usage)
                else:
                    text = args.pop(0)
            set_value(name, read(text, keys[name], arg, usage), arg)
        elif files:
            for name, value in run_config_file(arg, usage).items():
                if name not in keys:
                    fail(f"{arg}: unknown config key {name!r}; valid keys: "
                         f"{', '.join(sorted(keys))}", usage)
                set_value(name, value, arg)
        elif positional:
            found.append(arg)
        else:
            fail(f"unrecognized arguments: {arg}", usage)
    if positional:
        if not found:
            fail(f"the following arguments are required: {positional}", usage)
        config[positional] = found
    if missing := [f'--{n}' for n, k in keys.items() if k.required and config[n] is None]:
        fail(f"the following arguments are required: {', '.join(missing)}", usage)
    for rule in rules:  # last: a rule ties keys that may be set in any order
        if not eval(rule, {}, config):
            named = dict.fromkeys(n.id for n in ast.walk(ast.parse(rule))
                                  if isinstance(n, ast.Name) and n.id in config)
            fail(f"{' '.join(f'--{n}={shown(config[n])}' for n in named)}: must have {rule}", usage)
    return config


def run_config_file(path, usage):
    """The names a config file assigns, with their values; a fault in it names its line."""
    if not os.path.isfile(path):
        fail(f"config file {path} not found", usage)
    values = {}
    try:
        with open(path, 'rb') as f:  # bytes: Python reads the encoding as in any source
            exec(compile(f.read(), path, 'exec'), {}, values)
    except SyntaxError as e:
        where = f", line {e.lineno}" if e.lineno else ''
        fail(f"{path}{where}: {e.msg}; a config file is Python: fix that line", usage)
    except Exception as e:  # the file ran and raised: the line of the file where it did
        lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__)
                 if frame.filename == path]
        where = f", line {lines[-1]}" if lines else ''
        fail(f"{path}{where}: {type(e).__name__}: {' '.join(str(e).split())}; a config file is "
             "Python: fix that line", usage)
    return values


def read(text, key, where, usage):
    """A command line's text as a value of the key's type (check() then validates it)."""
    kind = type(key.default) if key.default is not None else (key.types or (str,))[0]
    if text == 'None' and (key.default is None or key.types):
        return None
    if text in BOOLS and bool in (kind,) + key.types:  # among other types too (--gate=True)
        return BOOLS[text]
    if kind in (str, bool):
        return text
    if kind is list:
        item = type(key.default[0]) if key.default else str
        try:
            return [item(v) for v in text.split(',')]
        except ValueError:
            fail(f"{where}: expected comma-separated {item.__name__} values, got {text!r}", usage)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # not a literal: the type check names it


def check(name, key, value, where, usage=''):
    """The value, checked against the key's type (ints widened to float), choices and range."""
    allowed = key.types + (type(None),) if key.types else (type(key.default),)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = ' or '.join(t.__name__ for t in allowed)
        wanted = ' or '.join(t.__name__ for t in allowed if t is not type(None))
        fail(f"{where}: {name}={value!r} has type {type(value).__name__}, expected {names} "
             f"(invalid {wanted} value: {value!r})", usage)
    valid = ', '.join(map(str, key.choices or ()))
    if key.choices is not None and isinstance(value, list):
        if unknown := [str(v) for v in value if v not in key.choices]:
            fail(f"{where}: unknown {', '.join(unknown)}; choose from {valid}", usage)
    elif key.choices is not None and value not in key.choices and (value is not None
                                                                    or key.default is not None):
        fail(f"{where}: invalid choice: {name}={value!r}; valid values: {valid}", usage)
    if key.unique and isinstance(value, list) and len({*map(str, value)}) < len(value):
        fail(f"{where}: {', '.join({str(v): 0 for i, v in enumerate(value) if v in value[:i]})} "
             f"given more than once; --{name} takes each value once", usage)
    if any(v is not None and not within(key, v)
           for v in (value if isinstance(value, list) else [value])):
        origin = '' if where.startswith('--') else f"{where}: "  # a config file set it
        fail(f"{origin}--{name}={shown(value)} is out of range: "
             f"{'each ' if isinstance(value, list) else ''}must be {bounds(key)}", usage)
    return value


def within(key, value):
    return ((key.min is None or value >= key.min) and (key.max is None or value <= key.max)
            and (key.above is None or value > key.above)
            and (key.below is None or value < key.below))


def bounds(key):
    """The key's range as errors and --help write it: '>= 1', '> 0', 'in [0, 1)'; '' if none."""
    low, opening, at_least = (key.min, '[', '>=') if key.min is not None else (key.above, '(', '>')
    high, closing, at_most = (key.max, ']', '<=') if key.max is not None else (key.below, ')', '<')
    if low is not None and high is not None:
        return f"in {opening}{low}, {high}{closing}"
    if low is not None:
        return f"{at_least} {low}"
    return f"{at_most} {high}" if high is not None else ''


def shown(value):
    """A value as the command line writes it."""
    return ','.join(map(str, value)) if isinstance(value, list) else str(value)


def describe(name, key):
    """One --help line: the key, its default, help, choices, range."""
    choices = f"one of {', '.join(map(str, key.choices))}" if key.choices is not None else ''
    notes = [note for note in (key.help, choices, bounds(key)) if note]
    written = shown(key.default) if isinstance(key.default, list) else repr(key.default)
    default = 'required' if key.required else f"default {written}"
    return f"  --{name:<22} {default}" + (f"; {'; '.join(notes)}" if notes else '')
