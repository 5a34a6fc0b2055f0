"""What each attention variant adds to one decoder layer's compiled training graph, the way train.py
compiles it (lmkit.distributed.compile_layers: torch.compile per layer): the aten operators of the
forward and backward graphs that AOTAutograd hands to the compiler, and, on CPU, the kernels
TorchInductor then generates from them (its fusion). No GPU is needed; docs/benchmarks.md ("What the
variants add to the compiled graph") holds a run's table.

    python -m tools.graph_ops   # every variant, float32, the tiny shape at T = 256
    python -m tools.graph_ops --variants=softmax,affine --dtype=bfloat16
"""
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m tools.graph_ops")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch  # noqa: E402
from functorch.compile import make_boxed_func  # noqa: E402
from torch._functorch.aot_autograd import aot_module_simplified  # noqa: E402

from configurator import Key, parse  # noqa: E402
from lmkit.errors import run_script  # noqa: E402
from model import ATTENTIONS, MODEL_SHAPES, GPT, ModelConfig, rope_cos_sin  # noqa: E402

KEYS = dict(variants=Key(list(ATTENTIONS), 'comma-separated', choices=ATTENTIONS),
            dtype=Key('float32', 'float32, or bfloat16 under autocast as train.py on a GPU',
                      choices=('float32', 'bfloat16')),
            seq_len=Key(256, min=2), batch_size=Key(2, min=1),
            kernels=Key(True, 'also count the kernels TorchInductor generates on CPU (slower: it '
                              'compiles)'))


def aten_ops(gm):
    """{operator: count} of a graph's call_function nodes (getitem and other Python glue left
    out)."""
    return collections.Counter(str(n.target).removeprefix('aten.') for n in gm.graph.nodes
                               if n.op == 'call_function' and str(n.target).startswith('aten.'))


def layer_graphs(variant, args):
    """(forward ops, backward ops) of one decoder layer's training step, as AOTAutograd partitions
    it."""
    torch._dynamo.reset()
    config = ModelConfig(**MODEL_SHAPES['tiny'] | dict(attention=variant, block_size=args.seq_len))
    model = GPT(config).train()
    layer = model.model.layers[0]
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(aten_ops(gm))
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    run_layer(model, compiled, args)
    return graphs[0], graphs[1]


def run_layer(model, layer, args):
    """One forward and backward of `layer` (model's first) on a random batch, as GPT.forward calls
    it."""
    x = torch.randn(args.batch_size, args.seq_len, model.config.n_embd, requires_grad=True)
    positions = torch.arange(args.seq_len)
    cos, sin = rope_cos_sin(model.config, positions)
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=args.dtype == 'bfloat16'):
        y = layer(x, cos, sin, positions)
    y.float().square().mean().backward()


def inductor_kernels(variant, args):
    """The kernels TorchInductor generates for one layer's forward and backward on CPU."""
    from torch._inductor import metrics
    torch._dynamo.reset()
    config = ModelConfig(**MODEL_SHAPES['tiny'] | dict(attention=variant, block_size=args.seq_len))
    model = GPT(config).train()
    metrics.reset()
    run_layer(model, torch.compile(model.model.layers[0], fullgraph=True), args)
    return metrics.generated_kernel_count


def main(argv=None):
    args = type('Args', (),
                parse(sys.argv[1:] if argv is None else argv, KEYS, __doc__, prog='graph_ops.py'))
    rows, base = [], None
    for variant in args.variants:
        forward, backward = layer_graphs(variant, args)
        kernels = inductor_kernels(variant, args) if args.kernels else None
        base = base or (forward, backward)
        extra = (forward - base[0]) + (backward - base[1])
        rows.append((variant, sum(forward.values()), sum(backward.values()), kernels,
                     ', '.join(f'{op} '
                               f'x{n}' if n > 1 else op for op, n in sorted(extra.items())) or '-'))
        print(f'  {variant}: {rows[-1][1]} + {rows[-1][2]} ops, {kernels} '
              'kernels', file=sys.stderr, flush=True)
    print(f'One decoder layer (tiny shape, batch {args.batch_size} x {args.seq_len}, '
          f'{args.dtype}), torch {torch.__version__}: aten operators in the forward and backward '
          'graphs AOTAutograd hands the compiler'
          + (', and the kernels TorchInductor generates from them on '
             'CPU' if args.kernels else '') + f'; the last '
          f'column: operators beyond {args.variants[0]}\'s.\n')
    print('| variant | forward ops | backward ops | inductor kernels (CPU) | operators beyond the '
          'first row |')
    print('|---|---|---|---|---|')
    for variant, fw, bw, kernels, extra in rows:
        print(f'| {variant} | {fw} | {bw} | {"-" if kernels is None else kernels} | {extra} |')


if __name__ == '__main__':
    run_script(main)
