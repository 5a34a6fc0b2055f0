"""The repository's layout (docs/implementation.md, "Files"): the root holds the paper's modules
(the network, its kernels, the distillation), the configurator and the scripts a reader runs; what
they share is the library, lmkit/, which imports no script; the study and the measuring tools live
in study/ and tools/, and nothing at the root or in the library imports them. Tests may import
anything."""
import ast
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# and the configurator
PAPER_MODULES = {'model.py', 'attention_kernels.py', 'distill.py', 'configurator.py'}
FOLDERS = ('', 'lmkit', 'study', 'tools', 'scripts')


def sources(folder):
    return sorted(p for p in glob.glob(os.path.join(ROOT, folder, '*.py'))
                  if not p.endswith('__init__.py'))


def module_name(path):
    """The name a file is imported by: model, lmkit.data, study.sink_study."""
    return os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')


def imported(path):
    """Every module a file imports, at its top or inside a function: 'lmkit.data' for `from
    lmkit.data import x` and for `from lmkit import data`."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f'{node.module}.{alias.name}' for alias in node.names}
        # an export's relative import, within lmkit/
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            names |= {f'lmkit.{node.module or alias.name}' for alias in node.names}
    return names


def is_script(path):
    """A file run as a command: its __main__ block calls its main, or it is a moved command's
    one-line notice. (A module's own __main__ block may say that it is not a command:
    tools/memory_measure.py.)"""
    text = open(path, encoding='utf-8').read()
    main = re.search(r"^if __name__ == ['\"]__main__['\"]:(.*)", text, re.M | re.S)
    return bool(main and re.search(r'\bmain\b', main.group(1))) or text.startswith('"""Moved: run')


# distill.py is run too (its teacher check), and imported like model.py: a paper's module, not a
# script
SCRIPTS = {module_name(p) for folder in FOLDERS for p in sources(folder)
           if is_script(p)} - {'distill'}


def test_the_root_holds_the_papers_modules_the_configurator_and_scripts():
    root = sources('')
    assert len(root) <= 14, [os.path.basename(p) for p in root]
    assert {os.path.basename(p) for p in root if module_name(p) not in SCRIPTS} == PAPER_MODULES
    assert {'train', 'prepare_data', 'eval_zeroshot', 'sample', 'export_hf',
            'quickstart'} <= SCRIPTS


def test_no_file_imports_a_script():
    """What a script shares lives in lmkit/; a script is run (a subprocess), never imported, outside
    the tests."""
    found = {(module_name(p), name) for folder in FOLDERS for p in sources(folder)
             for name in imported(p) if name in SCRIPTS}
    assert not found


def test_the_library_imports_no_script_and_neither_it_nor_the_root_imports_the_study_or_the_tools():
    for path in sources('lmkit') + sources(''):
        outside = {name for name in imported(path) if name.split('.')[0] in ('study', 'tools')}
        assert not outside, (module_name(path), outside)
    for path in sources('lmkit'):
        ours = {name.split('.')[0] for name in imported(path)} & {module_name(p)
                                                                  for p in sources('')}
        assert ours <= {name[:-3] for name in PAPER_MODULES}, (module_name(path), ours)


WAIT_POLICY = "os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')"


def sets_the_wait_policy_first(path):
    """Whether a file sets OMP_WAIT_POLICY (WAIT_POLICY) at its top before its first import that is
    neither Python's own nor the pure-Python configurator."""
    for node in ast.parse(open(path, encoding='utf-8').read()).body:
        if isinstance(node, ast.Expr) and ast.unparse(node) == WAIT_POLICY:
            return True
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if any(name.split('.')[0] not in sys.stdlib_module_names | {'configurator'}
               for name in names):
            return False
    return False


def loads_torch(path):
    """Whether a file, or a file of ours it imports (at its top or in a function, transitively),
    imports torch."""
    ours = {module_name(p): p for folder in FOLDERS for p in sources(folder)}
    seen, todo = set(), [path]
    while todo:
        names = imported(todo.pop())
        if any(name.split('.')[0] == 'torch' for name in names):
            return True
        for name in names & set(ours) - seen:
            seen.add(name)
            todo.append(ours[name])
    return False


def test_every_script_that_loads_torch_sets_the_openmp_wait_policy_first():
    """Idle OpenMP threads sleep, not spin (issue 53; tools/bench.py's threads table). libgomp reads
    OMP_WAIT_POLICY once, when torch loads it, so every file run as a command that can load torch
    sets it at its top, before any import that could load torch. A policy the environment gives
    stays (setdefault)."""
    late = [module_name(p) for folder in FOLDERS for p in sources(folder)
            if is_script(p) and loads_torch(p) and not sets_the_wait_policy_first(p)]
    assert not late


def test_importing_the_library_changes_no_setting():
    """Issue 61: `import lmkit` set OMP_WAIT_POLICY, so every script had to import it first. Now
    importing the library, or a module of it, leaves the environment as it was."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}
    code = ("import os, lmkit, lmkit.runs, lmkit.probes; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert (done.returncode, done.stdout) == (0, 'None\n'), done.stderr


def test_no_function_outside_the_tests_is_over_80_lines():
    """A function a reader can hold in view: at most 80 lines from its def to its last line
    (docstring included)."""
    trees = {module_name(p): ast.parse(open(p, encoding='utf-8').read()) for folder in FOLDERS
             for p in sources(folder)}
    long = [(name, node.name, node.end_lineno - node.lineno + 1) for name, tree in trees.items()
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 80]
    assert not long


def test_one_function_per_name_across_the_library():
    """A name in lmkit/ means one thing: no two of its modules define a function or class of the
    same name."""
    where = {}
    for path in sources('lmkit'):
        for node in ast.parse(open(path, encoding='utf-8').read()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                where.setdefault(node.name, []).append(module_name(path))
    assert not {name: modules for name, modules in where.items() if len(modules) > 1}


def test_a_training_run_lives_in_two_rooms():
    """train.py (its loop, setup, checks and records) and lmkit/runs.py (what other programs need to
    know about a run): train.py imports at most 7 library modules, and no library module is imported
    by train.py alone (it would be a room of train.py's, folded into it)."""
    library = {module_name(p) for p in sources('lmkit')}
    of_train = {name for name in imported(os.path.join(ROOT, 'train.py')) if name in library}
    assert len(of_train) <= 7, sorted(of_train)
    others = set().union(*(imported(p) for folder in FOLDERS for p in sources(folder)
                           if not p.endswith(os.sep + 'train.py')))
    assert not of_train - others, 'only train.py imports these'


# the names the code gives a run's config dict; and a checkpoint's or a record's run config, reached
# as x['config']
CONFIG_NAMES = {'c', 'config', 'cfg', 'base', 'now', 'settings'}


def test_no_module_but_train_and_runs_reads_the_run_config_by_key():
    """Outside train.py and lmkit/runs.py a run's config is a RunConfig (attributes, greppable), or
    named arguments: no c['key'], config['key'] or x['config']['key'] / x['config'].get('key') with
    a train.py key."""
    sys.path.insert(0, ROOT)
    from lmkit.runs import KEYS
    found = []
    for path in (p for folder in FOLDERS for p in sources(folder)):
        if os.path.relpath(path, ROOT) in ('train.py', os.path.join('lmkit', 'runs.py')):
            continue
        for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, of = node.slice.value, node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == 'get'
                  and node.args and isinstance(node.args[0], ast.Constant)):
                key, of = node.args[0].value, node.func.value
            else:
                continue
            config = (isinstance(of, ast.Name) and of.id in CONFIG_NAMES
                      and not isinstance(node, ast.Call)) or (
                isinstance(of, ast.Subscript) and isinstance(of.slice, ast.Constant)
                                                              and of.slice.value == 'config')
            if config and key in KEYS:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_the_modules_run_with_python_m_answer_help():
    """Issue 62: `python -m tools.lm_eval_scores --help` gave a traceback, tools.tables,
    tools.harness_tasks and tools.builtin_data printed nothing, scripts.line_counts --help exited
    1. Now each prints its docstring and exits 0; those that have no command of their own say so,
    and say it run bare too (exit status 2)."""
    import importlib
    import subprocess
    for module in ('tools.lm_eval_scores', 'tools.tables', 'tools.harness_tasks',
                   'tools.builtin_data', 'scripts.line_counts'):
        done = subprocess.run([sys.executable, '-m', module, '--help'], cwd=ROOT,
                              capture_output=True, text=True)
        doc = importlib.import_module(module).__doc__.strip()
        assert (done.returncode, done.stderr) == (0, '') and done.stdout.startswith(doc), module
    for module in ('tools.tables', 'tools.harness_tasks', 'tools.builtin_data'):
        done = subprocess.run([sys.executable, '-m', module], cwd=ROOT, capture_output=True,
                              text=True)
        assert done.returncode == 2 and done.stderr == (
            f"error: {module.split('.')[1]}.py is a module the tools import, with no command of "
            "its own (--help says what it holds)\n")


def test_programs_outside_the_root_run_as_modules():
    """study/, tools/ and scripts/ hold no sys.path edits: their programs run from the root as
    `python -m folder.name`, and run as a file each says so in one line (exit status 1), before any
    import of ours."""
    for path in (p for folder in FOLDERS for p in sources(folder)):
        text = open(path, encoding='utf-8').read()
        assert not re.search(r'sys\.path\.(insert|append)', text), os.path.relpath(path, ROOT)
    import subprocess
    for name in ('tools/bench.py', 'study/sink_study.py', 'scripts/line_counts.py'):
        done = subprocess.run([sys.executable, os.path.join(ROOT, name)], capture_output=True,
                              text=True)
        module = name[:-3].replace('/', '.')
        assert (done.returncode, done.stderr) == (1,
                                                  "run it from the repository's root: python -m "
                                                  f"{module}\n")
