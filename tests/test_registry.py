"""model.py's VARIANTS is the one place that knows the attention variants: no other module (configs and tests aside)
names one or branches on the attention flag, so that a new variant is one entry there (docs/implementation.md,
"Adding your own attention")."""
import ast
from pathlib import Path

from model import ATTENTIONS

ROOT = Path(__file__).resolve().parents[1]


def attention_flag(node):
    """Whether an expression reads the attention flag: x.attention, or x['attention']."""
    return (isinstance(node, ast.Attribute) and node.attr == 'attention') or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 'attention')


def variant_names_and_branches(path):
    """(line, what) for every string literal that is a variant's name and every comparison of the attention flag."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in ATTENTIONS:
            found.append((node.lineno, f'the literal {node.value!r}'))
        elif isinstance(node, ast.Compare) and any(attention_flag(n) for n in (node.left, *node.comparators)):
            found.append((node.lineno, 'a comparison of the attention flag'))
    return sorted(found)


def test_no_module_but_model_names_a_variant():
    modules = [p for p in (*ROOT.glob('*.py'), *ROOT.glob('scripts/*.py')) if p.name != 'model.py']
    assert len(modules) > 15
    found = [f'{p.relative_to(ROOT)}:{line}: {what}' for p in modules for line, what in variant_names_and_branches(p)]
    assert not found, 'read model.VARIANTS (or ModelConfig.variant) instead:\n' + '\n'.join(found)


def test_the_check_finds_names_and_branches(tmp_path):
    """What the check above looks for, it finds."""
    module = tmp_path / 'm.py'
    module.write_text("x = ('softmax', 'other')\nif cfg.attention != y:\n    pass\nok = c['attention'] in names\n"
                      "fine = 'affine scaled'\n")
    assert [line for line, _ in variant_names_and_branches(module)] == [1, 2, 4]
