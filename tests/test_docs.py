"""The docs say only what the code does: the tables scripts/memory_tables.py computes are the ones README.md and
docs/*.md hold, docs/memory.md's statements about them hold, the training keys' defaults in docs/training.md are
train.py's, every relative link and #anchor resolves, and README.md stays a front door (at most 300 lines)."""
import glob
import importlib.util
import os
import re

import pytest

import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


@pytest.fixture(scope='module')
def memory_tables():
    spec = importlib.util.spec_from_file_location('memory_tables', os.path.join(ROOT, 'scripts', 'memory_tables.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_the_ones_in_the_docs(memory_tables):
    differ, unused = memory_tables.stale(memory_tables.tables())
    assert not differ, f'{differ}: regenerate them with python scripts/memory_tables.py --write'
    assert not unused, f'tables no file holds between markers: {unused}'


def test_what_docs_memory_says_about_the_plan(memory_tables):
    """docs/memory.md: DDP fits every 0.5B and 1B row with room for a larger micro-batch; the 3B rows need FSDP
    (under DDP not even micro-batch 1 with activation checkpointing fits), and FSDP fits them at the configs'
    micro-batch without recomputation. The configs choose accordingly."""
    fits = 0.9 * memory_tables.GPU_GIB
    for row in memory_tables.rows():
        if row.size in ('0.5b', '1b'):
            assert not row.c['fsdp'] and row.total(False) <= fits and row.total(False, micro=2 * row.micro) <= fits
        else:
            assert row.c['fsdp'] and row.total(True) <= fits and row.total(False, True, micro=1) > fits, row.name


def documented_defaults(path):
    """(key, default as written) of every row of the `| key | default | meaning |` tables in path."""
    rows, in_table = [], False
    for line in open(path, encoding='utf-8'):
        if line.startswith('| key | default |'):
            in_table = True
        elif in_table and line.startswith('|') and not line.startswith('|---'):
            cells = [c.strip() for c in line.strip().strip('|').split(' | ')]
            keys, defaults = re.findall(r'`(\w+)`', cells[0]), [d.strip().strip('`') for d in cells[1].split(',')]
            assert len(keys) == len(defaults), line
            rows += zip(keys, defaults)
        elif not line.startswith('|'):
            in_table = False
    return rows


def test_documented_training_defaults_are_train_pys():
    rows = documented_defaults(os.path.join(ROOT, 'docs', 'training.md'))
    assert len(rows) > 20
    for key, written in rows:
        value = train.KEYS[key].default
        if value is None or isinstance(value, (bool, str)):
            assert written == str(value), (key, written, value)
        else:
            assert float(written) == value, (key, written, value)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def outside_code(path):
    """The lines of a markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in open(path, encoding='utf-8'):
        if line.lstrip().startswith('```'):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path):
    seen, found = {}, set()
    for line in outside_code(path):
        match = re.match(r'#+ (.*)', line)
        if match:
            base = slug(match.group(1))
            found.add(base if base not in seen else f'{base}-{seen[base]}')
            seen[base] = seen.get(base, 0) + 1
    return found


@pytest.mark.parametrize('path', DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_links_resolve(path):
    broken = []
    for line in outside_code(path):
        for target in re.findall(r'\]\(([^)\s]+)\)', re.sub(r'`[^`]*`', '', line)):  # not in inline code
            if re.match(r'[a-z]+:', target):
                continue  # https:, mailto:
            file, _, anchor = target.partition('#')
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(linked) or anchor and anchor not in anchors(linked):
                broken.append(target)
    assert not broken, f'{os.path.relpath(path, ROOT)}: links to nothing: {broken}'


def test_readme_is_a_front_door():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        assert len(f.read().splitlines()) <= 300
