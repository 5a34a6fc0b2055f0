"""Names of what is gone: each `*.py` file and `module.name` that README.md, docs/*.md and the
comments and strings (docstrings, --help texts) of the Python files outside tests/ mention exists,
and no line there, code included, names common.py (common.py, common.name, common's, lmkit.common,
an import). Each test lists every stale mention at once, as path:line: mention (why). URLs are
skipped; FOREIGN lists other projects' files cited on purpose. `module.name` is ours when module
is lmkit/study/tools/scripts.<file> or the bare stem of one of our files; a stem that is also an
everyday variable or word (WORDS: model, data, tokenizer...) counts only before a name some file
of ours defines at top level: `data.read_shard` is checked; `model.generate()`, `tokenizer.json`,
`data.md` are not. Limit: such a word before a name deleted everywhere goes unseen."""
import ast
import io
import os
import re
import subprocess
import tokenize
from functools import lru_cache

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('lmkit', 'study', 'tools', 'scripts')

# Files of other projects that the docs and docstrings cite on purpose (key/: all under it)
FOREIGN = {
    'lm_eval/': "lm-evaluation-harness's sources, which lmkit/zeroshot.py reproduces",
    'utils.py': "the harness's lm_eval/tasks/hellaswag/utils.py (docs/evaluation.md's table)",
    'preprocess_winogrande.py': "the harness's winogrande task (docs/evaluation.md, zeroshot.py)",
    'datautils.py': "IST-DASLab/gptq's C4 loader: the protocol of our C4 perplexity",
    'llama.py': "IST-DASLab/gptq's evaluation loop (llama_eval): the same protocol",
    'pretrain/': "Gu et al.'s attention-sink code, which lmkit/probes.py's sink scores follow",
    'lit_gpt/': "Gu et al.'s attention-sink code (the sink and softmax1 variants)",
    'transformers_language/': "Bondarenko et al.'s outlier code (lmkit/probes.py's kurtosis)",
    'quantization/': "Bondarenko et al.'s quantizers (lmkit/probes.py's W8A8 grid)",
    'validate_clm.py': "Bondarenko et al.'s evaluation script",
    'uniform_quantizers.py': "Bondarenko et al.'s quantization/quantizers/uniform_quantizers.py",
    'flash_attention.py': "nanochat's kernel file, to which attention_kernels.py's header compares",
    'config/x.py': 'a placeholder for any config file (docs/implementation.md)',
}
# Stems of our files that the text also uses as variables or plain words
WORDS = {'model', 'data', 'tokenizer', 'device', 'files', 'runs', 'stats', 'sample', 'checkpoint',
         'train', 'training', 'errors', 'measure', 'children', 'loading', 'probes', 'resume',
         'progress', 'significance', 'distributed'}
URL = re.compile(r'\b[a-z]+://\S+')
PY_FILE = re.compile(r'(?<![\w./\-{}*$<])((?:[\w-]+/)*[\w-]+\.py)\b')  # not a glob's or ${x}'s tail
QUALIFIED = re.compile(r'(?<![\w./-])(%s)\.([a-z_]\w*)(?:\.([A-Za-z_]\w*))?(?:\.([A-Za-z_]\w*))?'
                       % '|'.join(PACKAGES))
FSTRING_MIDDLE = getattr(tokenize, 'FSTRING_MIDDLE', None)  # Python 3.12
COMMON = re.compile(r"(?<![\w.])(lmkit\.common\b|common(\.py\b|\.[A-Za-z_]\w*|'s\b))"
                    r"|\b(from common|import common)\b")


@lru_cache(None)
def listed():
    """The repository's files that are there now: git's tracked and untracked, not ignored."""
    try:
        out = subprocess.run(['git', 'ls-files', '-z', '-co', '--exclude-standard'], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split('\0')
    except (OSError, subprocess.CalledProcessError):  # no git: a walk, skipping what it ignores
        out = []
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not re.match(r'[._]|out|data$', d)]
            out += [os.path.relpath(os.path.join(top, name), ROOT) for name in names]
    return tuple(sorted(p for p in out if p and os.path.isfile(os.path.join(ROOT, p))))


def sources():
    files = listed()
    return (['README.md'] + [p for p in files if re.fullmatch(r'docs/[^/]+\.md', p)]
            + [p for p in files if p.endswith('.py') and not p.startswith('tests/')])


@lru_cache(None)
def prose(path, raw=False):
    """path's lines as a reader sees them, URLs blanked: a markdown file whole; of a Python file
    (unless raw) its comments and string literals only, f-strings without their {expressions}."""
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        text = f.read()
    if raw or not path.endswith('.py'):
        return [URL.sub(' ', line) for line in text.splitlines()]
    lines = [''] * (text.count('\n') + 2)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        kept = tok.string
        if tok.type not in (tokenize.STRING, tokenize.COMMENT, FSTRING_MIDDLE):
            continue
        if tok.type == tokenize.STRING and 'f' in re.match(r'\w*', kept).group().lower():
            kept = re.sub(r'\{[^{}]*\}', ' ', kept)  # (3.12 splits an f-string into tokens itself)
        for k, part in enumerate(kept.split('\n')):
            lines[tok.start[0] - 1 + k] += ' ' + part
    return [URL.sub(' ', line) for line in lines]


def mentions(pattern, raw=False):
    """('path:line', match) for each match of pattern in the sources."""
    for path in sources():
        for number, line in enumerate(prose(path, raw), 1):
            for match in pattern.finditer(line):
                yield f'{path}:{number}', match


@lru_cache(None)
def top_level(path):
    """(own, imported): the names path defines at top level (def, class, assignment), a class with
    the set of its members (methods, class attributes, self.x), others with None; and the names it
    imports, re-exports (they resolve a mention, but a name lives where it is defined)."""
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        todo = list(ast.parse(f.read()).body)
    own, imported = {}, set()
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ClassDef):
            inside = list(ast.walk(node))
            own[node.name] = {n.name for n in inside if isinstance(n, (
                ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} | {
                n.id if isinstance(n, ast.Name) else n.attr for n in inside
                if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {(alias.asname or alias.name).split('.')[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            own.update({n.id: None for n in ast.walk(node)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        if isinstance(node, (ast.If, ast.Try, ast.For, ast.While, ast.With)):  # their bodies too
            todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            todo += [s for handler in getattr(node, 'handlers', ()) for s in handler.body]
    return own, imported


@lru_cache(None)
def modules():
    """Our importable modules: {'train': ['train.py'], 'lmkit.data': [...], 'data': [...], ...}."""
    found = {}
    for path in listed():
        parts = path[:-len('.py')].split('/')
        if path.endswith('.py') and parts[-1] != '__init__' and (
                len(parts) == 1 or len(parts) == 2 and parts[0] in PACKAGES):
            for name in {'.'.join(parts), parts[-1]}:
                found.setdefault(name, []).append(path)
    return found


def owners(name):
    """The files of our modules that define name at top level."""
    return sorted({p for paths in modules().values() for p in paths if name in top_level(p)[0]})


def missing(module, name, member):
    """Why module.name(.member) names nothing of ours, or None when it names something."""
    paths = modules()[module]
    if not any(name in top_level(p)[0] or name in top_level(p)[1] for p in paths):
        elsewhere = sorted(set(owners(name)) - set(paths))
        return f"{' or '.join(paths)} defines no {name}" + (
            f"; {', '.join(elsewhere)} does" if elsewhere else '')
    classes = [top_level(p)[0][name] for p in paths if top_level(p)[0].get(name) is not None]
    if member and classes and not any(member in members for members in classes):
        return f'{name} has no {member}'
    return None


def check(failures):
    if failures:
        pytest.fail('\n'.join(['names of what is gone (path:line: mention (why)):'] + failures),
                    pytrace=False)


def test_every_named_py_file_exists():
    files = set(listed())
    basenames = {os.path.basename(p) for p in files}
    failures = []
    for where, match in mentions(PY_FILE):
        name = match.group(1)
        if name in FOREIGN or any(name.startswith(k) for k in FOREIGN if k.endswith('/')):
            continue
        if name not in (files if '/' in name else basenames):
            failures.append(f'{where}: {name} (no such file)')
    check(failures)


def test_every_named_module_function_exists():
    failures = []
    for where, match in mentions(QUALIFIED):
        package, module, name, member = match.groups()
        init = f'{package}/__init__.py'
        if module == 'py' or init in listed() and module in set().union(*top_level(init)):
            continue  # (a name lmkit/__init__.py binds)
        if f'{package}.{module}' not in modules():
            failures.append(f'{where}: {match.group(0)} (no {package}/{module}.py)')
        elif name and name != 'py' and (why := missing(f'{package}.{module}', name, member)):
            failures.append(f'{where}: {match.group(0)} ({why})')
    stems = sorted((m for m in modules() if '.' not in m), key=len, reverse=True)
    bare = re.compile(r'(?<![\w./-])(%s)\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?' % '|'.join(stems))
    for where, match in mentions(bare):
        module, name, member = match.groups()
        if name == 'py' or module in WORDS and not owners(name):
            continue
        if why := missing(module, name, member):
            failures.append(f'{where}: {match.group(0)} ({why})')
    check(failures)


def test_nothing_names_common_py():
    check([f'{where}: {match.group(0)} (common.py is gone: name the lmkit module that holds it)'
           for where, match in mentions(COMMON, raw=True)])
