"""
The repository's map in numbers: the lines of every Python file at the top level and in lmkit/, and
of the reading set of one training step and one variant (docs/implementation.md, "Reading order").

    python -m scripts.line_counts           # print the table
    python -m scripts.line_counts --write   # write it into docs/implementation.md, at its markers

tests/test_docs.py holds the docs' table to this script's, and the reading sets to their limits.
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

# What a reader opens, in order, to follow one training step and one variant: train.py's loop, the
# network and its variants down to the kernels, the data's windows, the flags, what runs the model
# over ranks
READING_SET = ('train.py', 'model.py', 'attention_kernels.py', 'lmkit/data.py', 'configurator.py',
               'lmkit/distributed.py', 'lmkit/runs.py')
# the map's promises (docs/implementation.md, "Reading order")
LIMITS = {'reading set': 2350, 'model.py': 625, 'distill.py': 250, 'lmkit/data.py': 400,
          'train.py': 550}


def lines(path):
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        return sum(1 for _ in f)


def table():
    """The markdown of the map's numbers: every top-level .py file's lines, then the reading set's
    total."""
    files = sorted(os.path.relpath(p, ROOT) for folder in ('', 'lmkit')
                   for p in glob.glob(os.path.join(ROOT, folder, '*.py'))
                   if not p.endswith('__init__.py'))
    return '\n'.join(['| file | lines |', '|---|---:|',
                      *[f'| `{name}` | {lines(name):,} |' for name in files],
                      "| **one training step and one variant**: "
                      f"{', '.join(f'`{p}`' for p in READING_SET)} | **{reading_set_lines():,}** |",
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


def module_imports(path, modules):
    """The files of this repository a file imports at module level (an import inside a function runs
    only when called, as GPT.from_pretrained's of lmkit.loading, and draws no edge)."""
    package = os.path.dirname(path).replace(os.sep, '.')
    found = set()
    for node in ast.parse(open(os.path.join(ROOT, path), encoding='utf-8').read()).body:
        blocks = ([node.body, *(h.body for h in node.handlers)] if isinstance(node, ast.Try)
                  else [[node]])
        for inner in (n for block in blocks for n in block):
            if isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                base = inner.module or ''
                if inner.level:
                    base = '.'.join(filter(None, [package, base]))
                names = [base] + [f'{base}.{alias.name}' for alias in inner.names]
            else:
                continue
            found |= {modules[name] for name in names if name in modules}
    return found - {path}


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


def reading_set_lines():
    return sum(lines(path) for path in READING_SET)


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
