"""
The repository's map in numbers: the lines of every Python file at the top level and in lmkit/, and
what a reader of one training step reads (docs/implementation.md, "Reading order"): the core (the
paper's files, the configurator and every module of ours train.py imports at its top) and
everything train.py reaches (every module of ours it imports, at the top or inside a function, and
what those import, transitively).

    python -m scripts.line_counts           # print the table
    python -m scripts.line_counts --write   # write it into docs/implementation.md, at its markers

tests/test_docs.py holds the docs' table to this script's, and the two counts to their limits.
"""
import ast
import functools
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m scripts.line_counts")
from lmkit.files import atomic_write  # noqa: E402
DOC = os.path.join(ROOT, 'docs', 'implementation.md')
START, END = '<!-- scripts/line_counts.py: start -->', '<!-- scripts/line_counts.py: end -->'

# The paper's files and the configurator; with what train.py imports at its top, the core
CORE_FILES = ('model.py', 'attention_kernels.py', 'train.py', 'distill.py', 'configurator.py')
# the map's promises (docs/implementation.md, "Reading order")
LIMITS = {'core': 2400, 'reachable': 4000, 'model.py': 625, 'distill.py': 250,
          'lmkit/data.py': 400, 'train.py': 350}


def lines(path):
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        return sum(1 for _ in f)


def table():
    """The markdown of the map's numbers: every top-level .py file's lines, the core's and what
    train.py reaches, then the import layers."""
    files = sorted(os.path.relpath(p, ROOT) for folder in ('', 'lmkit')
                   for p in glob.glob(os.path.join(ROOT, folder, '*.py'))
                   if not p.endswith('__init__.py'))
    core, reached = core_files(), reachable_files()
    return '\n'.join(['| file | lines |', '|---|---:|',
                      *[f'| `{name}` | {lines(name):,} |' for name in files],
                      f"| **the core** ({len(core)} files): {', '.join(f'`{p}`' for p in core)} "
                      f"| **{total(core):,}** |",
                      f"| **everything `train.py` reaches**, lazy imports included "
                      f"({len(reached)} files) | **{total(reached):,}** |",
                      '',
                      'Imports, at module level (each file imports only files of the layers '
                      'above it):',
                      '', '| layer | files |', '|---:|---|',
                      *[f"| {k} | {', '.join(f'`{p}`' for p in paths)} |"
                        for k, paths in enumerate(import_layers())]])


# the folders whose imports the map draws (scripts/ and tests/ import freely)
LAYERED = ('', 'lmkit', 'study', 'tools')


def module_files():
    """{module name: path relative to the root} of every Python file the map layers."""
    return {os.path.relpath(p, ROOT)[:-3].replace(os.sep, '.'): os.path.relpath(p, ROOT)
            for folder in LAYERED
            for p in glob.glob(os.path.join(ROOT, folder, '*.py')) if not p.endswith('__init__.py')}


def module_imports(path, modules, anywhere=False):
    """The files of this repository a file imports at module level (an import inside a function
    runs only when called, as GPT.from_pretrained's of lmkit.pretrained, and draws no edge), or
    anywhere in it. A package's __init__.py, which an import of any of its modules runs, counts."""
    package = os.path.dirname(path).replace(os.sep, '.')
    tree = ast.parse(open(os.path.join(ROOT, path), encoding='utf-8').read())
    found = set()
    for node in ast.walk(tree) if anywhere else top_level(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                base = '.'.join(filter(None, [package, base]))
            names = [base] + [f'{base}.{alias.name}' for alias in node.names]
        else:
            continue
        found |= {modules[name] for name in names if name in modules}
        found |= {modules[name.split('.')[0]] for name in names
                  if '.' in name and name.split('.')[0] in modules}
    return found - {path}


def top_level(tree):
    """The statements at a module's top, with those inside its try blocks (an import's fallback)."""
    for node in tree.body:
        yield from ([*node.body, *(n for h in node.handlers for n in h.body)]
                    if isinstance(node, ast.Try) else [node])


def import_layers():
    """[[files of layer 0], [layer 1], ...]: layer 0 imports none of ours, and each file sits one
    above the highest file it imports."""
    modules = module_files()
    edges = {path: module_imports(path, modules) for path in modules.values()}

    @functools.cache
    def layer(path):
        return 1 + max((layer(dep) for dep in edges[path]), default=-1)
    layers = {}
    for path in edges:
        layers.setdefault(layer(path), []).append(path)
    return [sorted(layers[k]) for k in sorted(layers)]


def packages():
    """{package name: its __init__.py} of the folders the map layers."""
    return {folder: os.path.join(folder, '__init__.py') for folder in LAYERED
            if folder and os.path.isfile(os.path.join(ROOT, folder, '__init__.py'))}


def core_files():
    """The paper's files and the configurator (CORE_FILES), then every file of ours train.py
    imports at its top, in that order."""
    modules = module_files() | packages()
    imported = module_imports('train.py', modules)
    return [*CORE_FILES, *sorted(imported - set(CORE_FILES))]


def reachable_files():
    """Every file of ours train.py imports, at its top or inside a function, and what those
    import, transitively; train.py first."""
    modules = module_files() | packages()
    seen, todo = ['train.py'], ['train.py']
    while todo:
        for path in sorted(module_imports(todo.pop(), modules, anywhere=True) - set(seen)):
            seen.append(path)
            todo.append(path)
    return seen


def total(paths):
    return sum(lines(path) for path in paths)


def in_doc():
    """The table docs/implementation.md holds between the markers."""
    with open(DOC, encoding='utf-8') as f:
        text = f.read()
    return text[text.index(START) + len(START):text.index(END)].strip('\n')


def main(argv):
    if argv in (['-h'], ['--help']):
        return print(__doc__.strip())
    if argv not in ([], ['--write']):
        raise SystemExit(f"usage: python -m scripts.line_counts [--write]; got {' '.join(argv)}")
    if not argv:
        return print(table())
    with open(DOC, encoding='utf-8') as f:
        text = f.read()
    text = text[:text.index(START) + len(START)] + '\n' + table() + '\n' + text[text.index(END):]
    with atomic_write(DOC) as f:  # the docs whole or as they were, and no other file touched
        f.write(text)
    print(f"wrote the table into {os.path.relpath(DOC)}")


if __name__ == '__main__':
    main(sys.argv[1:])
