"""model.py's VARIANTS is the one place that knows the attention variants: no other module (configs
and tests aside) names one or branches on the attention flag, so that a new variant is one entry
there (docs/implementation.md, "Adding your own attention")."""
import ast
from pathlib import Path

from model import ATTENTIONS

ROOT = Path(__file__).resolve().parents[1]


def attention_flag(node):
    """Whether an expression reads the attention flag: x.attention, or x['attention']."""
    return (isinstance(node, ast.Attribute) and node.attr == 'attention') or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
        and node.slice.value == 'attention')


def variant_names_and_branches(path):
    """(line, what) for every string literal that is a variant's name and every comparison of the
    attention flag."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in ATTENTIONS:
            found.append((node.lineno, f'the literal {node.value!r}'))
        elif isinstance(node, ast.Compare) and any(attention_flag(n)
                                                   for n in (node.left, *node.comparators)):
            found.append((node.lineno, 'a comparison of the attention flag'))
    return sorted(found)


def test_no_module_but_model_names_a_variant():
    modules = [p for p in (*ROOT.glob('*.py'), *ROOT.glob('scripts/*.py')) if p.name != 'model.py']
    assert len(modules) > 15
    found = [f'{p.relative_to(ROOT)}:{line}: '
             f'{what}' for p in modules for line, what in variant_names_and_branches(p)]
    assert not found, 'read model.VARIANTS (or ModelConfig.variant) instead:\n' + '\n'.join(found)


def test_the_check_finds_names_and_branches(tmp_path):
    """What the check above looks for, it finds."""
    module = tmp_path / 'm.py'
    module.write_text("x = ('softmax', 'other')\nif cfg.attention != y:\n    pass\nok = "
                      "c['attention'] in names\nfine = 'affine scaled'\n")
    assert [line for line, _ in variant_names_and_branches(module)] == [1, 2, 4]


def test_graph_ops_names_what_a_variant_adds(capsys):
    """tools/graph_ops.py (docs/benchmarks.md's table of the compiled graphs): the gate adds its
    projection's three matmuls (forward, and the input's and weight's gradients) and a sigmoid with
    its backward to softmax's layer graph, and nothing else of substance; affine adds the cumulative
    sums of V (forward, and reversed backward)."""
    from tools import graph_ops
    graph_ops.main(['--variants=softmax,gated,affine', '--kernels=False', '--seq_len=16'])
    rows = {line.split(' | ')[0].strip('| '): line.split(' | ')
            for line in capsys.readouterr().out.splitlines()
            if line.startswith('| ') and not line.startswith('| variant')}
    assert list(rows) == ['softmax', 'gated', 'affine'] and rows['softmax'][-1].strip(' |') == '-'
    gated = rows['gated'][-1]
    assert ('mm.default x3' in gated and 'sigmoid.default' in gated
            and 'sigmoid_backward.default' in gated)
    assert 'cumsum' not in gated and 'cumsum.default x2' in rows['affine'][-1]
    assert 'flip.default x2' in rows['affine'][-1]  # the cumulative sum's backward: reversed
    assert (int(rows['gated'][1]) > int(rows['softmax'][1])
            and int(rows['affine'][2]) > int(rows['softmax'][2]))


# -----------------------------------------------------------------------------
# The repository's shape: model.py stands alone, and nothing imports an orchestrating script

# scripts that run the others: imported by nothing
ORCHESTRATORS = ('quickstart', 'sink_study', 'bench', 'gpu_check')

ONE_STEP = """
import torch
import model
for name in model.ATTENTIONS:
    torch.manual_seed(0)
    config = model.ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48, vocab_size=64,
                               block_size=16, attention=name)
    gpt = model.GPT(config)
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-2)
    idx = torch.randint(0, 64, (2, 16))
    _, loss = gpt(idx[:, :-1], idx[:, 1:])
    loss.backward()
    optimizer.step()
    gpt.update_alpha_ma()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in gpt.parameters())
    print(name, round(loss.item(), 4))
"""  # noqa: E501 (the script's own lines, kept as they run)


def test_model_py_stands_alone(tmp_path):
    """model.py and attention_kernels.py copied alone into an empty directory build and train one
    step of every registered variant there: the network imports nothing else of this repository."""
    import subprocess
    import sys
    from model import ATTENTIONS
    for name in ('model.py', 'attention_kernels.py'):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / 'one_step.py').write_text(ONE_STEP)
    done = subprocess.run([sys.executable, '-E', '-s', 'one_step.py'], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(ATTENTIONS)


def imported_modules(path):
    """Every module an import statement in the file names (at any depth: inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split('.')[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split('.')[0])
    return names


def test_nothing_imports_an_orchestrating_script():
    """quickstart.py, study/sink_study.py, tools/bench.py and the GPU acceptance run import library
    modules (and train.py's public functions); no module, script or orchestrator imports one of
    them."""
    files = [*ROOT.glob('*.py'), *ROOT.glob('scripts/*.py')]
    found = [f'{p.relative_to(ROOT)} imports '
             f'{name}' for p in files for name in sorted(imported_modules(p))
             if name in ORCHESTRATORS]
    assert not found, '\n'.join(found)


def test_the_import_check_finds_imports(tmp_path):
    module = tmp_path / 'm.py'
    module.write_text("import os, bench\ndef f():\n    from sink_study import x\n    from . import "
                      "y\n")
    assert imported_modules(module) == {'os', 'bench', 'sink_study'}

# -----------------------------------------------------------------------------
# docs/implementation.md's walkthrough "Adding your own attention", run


def walkthrough_blocks():
    """The python code blocks of docs/implementation.md's "Adding your own attention"."""
    import re
    text = (ROOT / 'docs' / 'implementation.md').read_text()
    section = text[text.index('## Adding your own attention'):]
    section = section[:section.index('\n## ', 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_walkthrough_is_the_code_and_its_minimal_entry_works(monkeypatch, capsys):
    """Its blocks are model.py's and tests/test_model.py's own lines (so they cannot drift), and the
    entry it says is enough, Variant(forward, weights), registered under a new name, is a working
    variant: its O(T) forward equals its explicit weights, which equal the walkthrough's float64
    reference; it trains a step; the dry run says that its activation memory is not planned."""
    import math
    import torch
    import analyze
    from lmkit import runs
    from lmkit.memory_plan import print_dry_run
    import model
    import train
    functions, entry, reference = walkthrough_blocks()
    assert functions in (ROOT / 'model.py').read_text() and entry in (ROOT / 'model.py').read_text()
    assert reference.split('\n\n\n')[0] in (ROOT / 'tests' / 'test_model.py').read_text()
    assert f'{entry.split(":")[0].strip()}: Variant(softmax1_forward, softmax1_weights' in entry

    namespace = vars(model).copy()
    exec(functions.replace('softmax1_', 'walkthrough_'), namespace)
    exec(reference.split('\n\n\n')[0].replace('softmax1_', 'walkthrough_'), namespace)
    name = 'walkthrough'
    monkeypatch.setitem(model.VARIANTS, name, model.Variant(namespace['walkthrough_forward'],
                                                            namespace['walkthrough_weights']))
    monkeypatch.setattr(model, 'ATTENTIONS', model.ATTENTIONS + (name,))
    torch.manual_seed(0)
    config = model.ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48,
                               vocab_size=64, block_size=16, attention=name)
    assert analyze.method_name(dict(attention=name)) == name  # its own name: no display given
    gpt = model.GPT(config).double()
    idx = torch.randint(0, 64, (2, 16))
    attn = gpt.model.layers[0].self_attn
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    positions = torch.arange(16)
    cos, sin = model.rope_cos_sin(config, positions)
    q, k, _ = attn.project(x, cos, sin)
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(config.head_dim)
    e = torch.where(torch.ones(16, 16, dtype=torch.bool).tril(), scores.exp(), torch.zeros(()))
    torch.testing.assert_close(attn.weights(x, cos, sin, positions),
                               namespace['walkthrough_reference'](e), rtol=1e-10, atol=1e-12)
    fast = attn(x, cos, sin, positions)
    attn.explicit = True
    torch.testing.assert_close(fast, attn(x, cos, sin, positions), rtol=1e-10, atol=1e-12)
    attn.explicit = False

    _, loss = gpt(idx[:, :-1], idx[:, 1:])
    loss.backward()
    torch.optim.AdamW(gpt.parameters(), lr=1e-2).step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in gpt.parameters())

    print_dry_run(runs.run_config(train.load_config([])), config)
    assert (f"{name}: activation memory not planned (memory_plan.SAVED_BYTES has no entry for "
            "it): counted as softmax attention's"
            in capsys.readouterr().out)
