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


def test_graph_ops_names_what_a_variant_adds(capsys):
    """scripts/graph_ops.py (docs/benchmarks.md's table of the compiled graphs): the gate adds its projection's three
    matmuls (forward, and the input's and weight's gradients) and a sigmoid with its backward to softmax's layer
    graph, and nothing else of substance; affine adds the cumulative sums of V (forward, and reversed backward)."""
    import importlib.util
    path = ROOT / 'scripts' / 'graph_ops.py'
    spec = importlib.util.spec_from_file_location('graph_ops', path)
    graph_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph_ops)
    graph_ops.main(['--variants=softmax,gated,affine', '--kernels=False', '--seq_len=16'])
    rows = {line.split(' | ')[0].strip('| '): line.split(' | ') for line in capsys.readouterr().out.splitlines()
            if line.startswith('| ') and not line.startswith('| variant')}
    assert list(rows) == ['softmax', 'gated', 'affine'] and rows['softmax'][-1].strip(' |') == '-'
    gated = rows['gated'][-1]
    assert 'mm.default x3' in gated and 'sigmoid.default' in gated and 'sigmoid_backward.default' in gated
    assert 'cumsum' not in gated and 'cumsum.default x2' in rows['affine'][-1]
    assert 'flip.default x2' in rows['affine'][-1]  # the cumulative sum's backward: reversed
    assert int(rows['gated'][1]) > int(rows['softmax'][1]) and int(rows['affine'][2]) > int(rows['softmax'][2])
