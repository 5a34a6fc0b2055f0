"""The tables of README.md and docs/*.md that the code computes, so that they cannot drift from it:
the paper configs' parameter counts (ΔParams), every paper row's per-GPU memory plan (train.py
--dry_run=True's) and the time estimates at an assumed MFU; no GPU, data or checkpoint is needed.
A table lies between <!-- memory_tables.py:start NAME --> and <!-- memory_tables.py:end NAME -->.

    python -m tools.memory_tables           # print every table, each under its marker name
    python -m tools.memory_tables --write   # put them into README.md and docs/*.md, between markers
    python -m tools.memory_tables --check   # exit 1 when a file holds another text
    python -m tools.memory_tables --measure # each row's plan against a fake-tensor measurement
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m tools.memory_tables")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch  # noqa: E402

from tools import memory_measure  # noqa: E402
from lmkit import memory_plan  # noqa: E402
from lmkit.run_records import variant_options  # noqa: E402
from lmkit.runs import load_config, run_config  # noqa: E402
from lmkit.measure import KNOWN_PEAK_BF16, flops_per_token  # noqa: E402
from configurator import parse  # noqa: E402
from lmkit.files import atomic_write  # noqa: E402
from lmkit.errors import run_script
from model import ATTENTIONS, BASELINE, FIELD_NAMES, GPT, ModelConfig  # noqa: E402

SIZES = ('0.5b', '1b', '3b')
# the machine the plan is for: 8 GPUs of 80 GiB (train.py's dry_run_* defaults)
GPUS, GPU_GIB = 8, 80
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)  # tried for the largest micro-batch that fits
# the time estimates: 40% of an H100's dense bf16 peak
ASSUMED_MFU, PEAK = 0.4, KNOWN_PEAK_BF16['H100']
START, END = '<!-- memory_tables.py:start {} -->', '<!-- memory_tables.py:end {} -->'
MARKED = re.compile(r'^<!-- memory_tables\.py:start (\S+) -->\n(.*?)^<!-- memory_tables\.py:end \1 '
                    r'-->$', re.M | re.S)


class Row:
    """One paper config: its name, training keys, student and teacher ModelConfigs."""

    def __init__(self, path, *overrides):
        self.name = os.path.basename(path)[:-3]
        self.variant, self.size = self.name.rsplit('_', 1) if '_' in self.name else (self.name, '')
        self.c = run_config(load_config([path, *overrides]))
        self.cfg = ModelConfig(**{k: getattr(self.c, k) for k in FIELD_NAMES})
        # in tables: the attention flag, '_' read as '+' (affine_gated: affine + gated), then its
        # options; rows in model.ATTENTIONS' order, a variant's options after it
        self.shown = self.cfg.attention.replace('_', ' + ') + variant_options(self.cfg)
        self.order = (ATTENTIONS.index(self.cfg.attention), self.shown)
        self.teacher_name = os.path.basename(os.path.normpath(self.c.teacher))
        self.teacher = ModelConfig(**memory_plan.KNOWN_TEACHERS[self.teacher_name])
        self.micro, self.gpus = self.c.micro_batch_size, self.c.dry_run_world_size

    def plan(self, fsdp, checkpointing=False, micro=None):
        """memory_estimate in GiB per component, on the GPUs the config's dry run plans for, in
        bfloat16 (dtype=auto on those GPUs)."""
        estimate = memory_plan.memory_estimate(self.cfg, self.gpus, micro or self.micro, 'bfloat16',
                                               fsdp, checkpointing, self.teacher)
        return {name: value / 2 ** 30 for name, value in estimate.items()}

    def total(self, fsdp, checkpointing=False, micro=None):
        return sum(self.plan(fsdp, checkpointing, micro).values())

    def largest_micro_batch(self, gpu_gib, fsdp=False, checkpointing=False):
        """The largest of MICRO_BATCHES whose plan fits one GPU of gpu_gib (memory_plan.verdict), or
        None."""
        return max((m for m in MICRO_BATCHES
                    if memory_plan.verdict(self.total(fsdp, checkpointing, m), gpu_gib) == 'fits'),
                   default=None)

    def mode(self, fsdp):
        return ('FSDP' if fsdp else 'DDP') + (' (config)' if fsdp == self.c.fsdp else '')


def rows():
    paths = glob.glob(os.path.join(ROOT, 'config', '*_*b.py'))
    found = sorted((Row(p) for p in paths), key=lambda r: (SIZES.index(r.size), r.order))
    return found


def table(header, lines):
    return '\n'.join(['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)] +
                     ['| ' + ' | '.join(str(x) for x in line) + ' |' for line in lines])


def gib_range(values):
    low, high = min(values), max(values)
    return f'{low:.1f} GiB' if f'{low:.1f}' == f'{high:.1f}' else f'{low:.1f}-{high:.1f} GiB'


class Flops:
    """FLOPs per token of a row's student (training) and teacher (forward: a third of its training
    FLOPs), and the time ASSUMED_MFU of PEAK on the row's GPUs would take for its tokens."""
    models = {}

    def __init__(self, row):
        self.student = flops_per_token(self.model(row.cfg))
        self.teacher = flops_per_token(self.model(row.teacher), row.cfg.block_size) / 3
        c = row.c
        self.tokens = c.max_iters * c.global_batch_size * row.cfg.block_size
        self.tokens_per_sec = row.gpus * PEAK * ASSUMED_MFU / (self.student + self.teacher)
        self.hours = self.tokens / self.tokens_per_sec / 3600
        # activation checkpointing runs the student's forward (a third of its training FLOPs) once
        # more
        self.recompute = self.student / 3 / (self.student + self.teacher)
        self.micro_step_sec = row.micro * row.cfg.block_size * (
            self.student + self.teacher) / (PEAK * ASSUMED_MFU)

    @classmethod
    def model(cls, cfg):
        if repr(cfg) not in cls.models:
            with torch.device('meta'):
                cls.models[repr(cfg)] = GPT(cfg)
        return cls.models[repr(cfg)]


def params_table(found):
    by = {(r.shown, r.size): memory_plan.meta_param_counts(r.cfg)[0] for r in found}
    columns = [s for _, s in sorted({r.order for r in found}) if s != BASELINE]
    header = ['size', f'{BASELINE} params'] + columns
    lines = [[size.upper(), f'{by[BASELINE, size]:,}'] +
             [f'+{by[v, size] - by[BASELINE, size]:,}' if (v, size) in by else '' for v in columns]
             for size in SIZES]
    return table(header, lines)


def plan_table(found):
    header = ['row', 'mode', 'micro-batch', 'weights', 'grads', 'AdamW', 'teacher', 'KD loss',
              'activations', '**total**', f'{GPU_GIB} GiB']
    lines = []
    for r in found:
        for fsdp in (False, True):
            p = r.plan(fsdp)
            total = sum(p.values())
            lines.append([r.name, r.mode(fsdp), r.micro] + [f'{p[k]:.1f}' for k in (
                'weights', 'gradients', 'optimizer', 'teacher', 'kd_loss', 'activations')] +
                [f'**{total:.1f}**', memory_plan.verdict(total, GPU_GIB)])
    return table(header, lines)


def totals_table(found):
    modes = [(False, False), (False, True), (True, False), (True, True)]
    header = ['row', 'DDP', 'DDP + act. ckpt', 'FSDP', 'FSDP + act. ckpt',
              'largest micro-batch that fits (DDP / DDP+AC / FSDP / FSDP+AC)']
    lines = []
    for r in found:
        totals = [r.total(fsdp, ac) for fsdp, ac in modes]
        largest = [r.largest_micro_batch(GPU_GIB, fsdp, ac) for fsdp, ac in modes]
        lines.append([f'{r.name} (micro-batch {r.micro})'] +
                     [f'{t:.1f} ({memory_plan.verdict(t, GPU_GIB)})' for t in totals] +
                     [' / '.join('-' if m is None else str(m) for m in largest)])
    return table(header, lines)


def size_groups(found):
    return [(size, [r for r in found if r.size == size]) for size in SIZES]


def multi_node_table(found):
    header = ['rows', '`config/`', 'mode', 'micro-batch', 'accumulation on 8 / 16 / 32 GPUs',
              'estimate per GPU', 'launch (per node)']
    lines = []
    for size, group in size_groups(found):
        first = group[0]
        fsdp, micro, batch = first.c.fsdp, first.micro, first.c.global_batch_size
        assert all(r.c.fsdp == fsdp and r.micro == micro and r.c.global_batch_size == batch
                   for r in group)
        names = [r.variant for r in group]
        lines.append([f'{size.upper()}: ' + ', '.join(r.shown for r in group),
                      '`{' + ','.join(names) + '}_' + size + '.py`', 'FSDP' if fsdp else 'DDP',
                      micro, ' / '.join(str(batch // (gpus * micro)) for gpus in (8, 16, 32)),
                      gib_range([r.total(fsdp) for r in group]),
                      f'`sbatch --nodes=N scripts/slurm_train.sh config/affine_{size}.py`'])
    return table(header, lines)


def run_tokens(found):
    """Tokens of one paper run (every paper config trains the same number)."""
    tokens = {Flops(r).tokens for r in found}
    assert len(tokens) == 1, tokens
    return tokens.pop()


def estimate_basis():
    return (f'an assumed {ASSUMED_MFU:.0%} MFU of {PEAK / 1e12:.0f} TFLOP/s per GPU (the H100\'s '
            'dense bf16 peak in `lmkit.measure.KNOWN_PEAK_BF16`)')


def flops_table(found):
    header = ['config', 'student train FLOP/token', 'teacher fwd FLOP/token',
              f'tokens/s on {GPUS} H100',
              f'hours for {run_tokens(found) / 1e9:.1f}B tokens', '+FLOPs with act. ckpt',
              'compute per micro-step', 'FSDP collectives per micro-step']
    lines = []
    for r in found:
        f = Flops(r)
        n_params = memory_plan.meta_param_counts(r.cfg)[0]
        # FSDP all-gathers the bf16 weights for the forward and again for the backward, and
        # reduce-scatters the fp32 gradients, on every micro-step: 2 + 2 + 4 bytes per parameter
        collectives = (f'{2 * n_params / 1e9:.1f} + {2 * n_params / 1e9:.1f} + '
                       f'{4 * n_params / 1e9:.1f} GB' if r.c.fsdp else '- (DDP)')
        lines.append([r.name, f'{f.student / 1e9:.1f} G', f'{f.teacher / 1e9:.1f} G',
                      f'{f.tokens_per_sec:,.0f}',
                      f'{f.hours:.0f}', f'{f.recompute:.0%}', f'{f.micro_step_sec:.2f} s',
                      collectives])
    return ('Estimates, not measurements: FLOPs per token from `lmkit.measure.flops_per_token` '
            f'(the teacher\'s forward: a third of its training FLOPs) at {estimate_basis()}, each '
            'config\'s micro-batch.\n\n'
            + table(header, lines))


def readme_table(found):
    header = ['size', 'teacher', 'data directory', 'launch', 'per-GPU memory (estimate)',
              f'time on {GPUS} x H100 (estimate)']
    lines = []
    for size, group in size_groups(found):
        first = group[0]
        hours = [Flops(r).hours for r in group]
        low, high = round(min(hours)), round(max(hours))
        lines.append([size.upper(), first.teacher_name, f'`{first.c.data_dir}`',
                      'FSDP (set in the configs)' if first.c.fsdp else 'DDP',
                      gib_range([r.total(r.c.fsdp) for r in group]),
                      f'~{low} h' if low == high else f'~{low}-{high} h'])
    c = found[0].c
    return (table(header, lines) + f'\n\nEach run: {c.max_iters:,} steps of '
                                   f'{c.global_batch_size:,} sequences of '
                                   f'{found[0].cfg.block_size:,} tokens '
                                   f'({run_tokens(found) / 1e9:.1f}B tokens). Memory: the plan '
                                   f'that `--dry_run=True` prints for {GPUS} GPUs of {GPU_GIB} '
                                   'GiB, over the size\'s configs. Time: an estimate from the '
                                   f'FLOPs per token at {estimate_basis()}, not a measurement.')


def onegpu_table():
    """The one-GPU tier (config/onegpu.py): each variant's parameters, its plan on one GPU of 24 and
    of 80 GiB at the largest micro-batch that fits there, and the estimated time on one H100."""
    header = ['config/onegpu.py', 'params', 'extra over softmax', 'one 24 GiB GPU',
              'one 80 GiB GPU', 'time on 1 x H100 (estimate)']
    lines = []
    for variant in ATTENTIONS:
        r = Row(os.path.join(ROOT, 'config', 'onegpu.py'), f'--attention={variant}')
        total = memory_plan.meta_param_counts(r.cfg)[0]
        softmax = memory_plan.meta_param_counts(ModelConfig(**{**vars(r.cfg),
                                                               'attention': BASELINE}))[0]
        fits = [f'micro-batch {best}: {r.total(False, micro=best):.1f} GiB'
                for best in (r.largest_micro_batch(24), r.largest_micro_batch(80))]
        lines.append([f'`--attention={variant}`', f'{total:,}', f'{total - softmax:,}', *fits,
                      f'~{Flops(r).hours:.1f} h'])
    c, cfg = r.c, r.cfg
    return (table(header, lines)
            + f'\n\nEach run: {c.max_iters:,} steps of {c.global_batch_size} '
            f'sequences of {cfg.block_size:,} tokens '
            f'({c.max_iters * c.global_batch_size * cfg.block_size / 1e9:.2f}B '
            'tokens), KD from SmolLM2-360M. Memory: the plan '
            '`--dry_run=True --dry_run_world_size=1 --dry_run_gpu_gib=24` '
            '(or 80) prints, at the largest micro-batch of '
            f'{", ".join(map(str, MICRO_BATCHES))} that fits with 10% to '
            'spare. Time: an estimate from the FLOPs per token at '
            f'{estimate_basis()}, not a measurement.')


def dry_run_example(config='config/affine_3b.py'):
    """What `python train.py <config> --dry_run=True` prints, run where no teacher checkpoint is (a
    temporary directory), so that the teacher is its published shape on any machine."""
    # train.py run, not imported: no file imports a script
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run([sys.executable, os.path.join(ROOT, 'train.py'),
                              os.path.join(ROOT, config),
                              '--dry_run=True'], cwd=empty, capture_output=True, text=True,
                             check=True).stdout
    return f'```\n$ python train.py {config} --dry_run=True\n{out.rstrip()}\n```'


def measured_table(found):
    """Each row's plan in the mode its config selects, against memory_measure.fake_peak_memory at
    full depth: the peak MemTracker sees in a training micro-step on fake tensors (real shapes, no
    memory). Minutes: never in the docs."""
    header = ['row', 'mode', 'micro-batch', 'plan', 'measured (fake tensors)', 'plan / measured']
    lines = []
    for r in found:
        plan = sum(memory_plan.memory_plan(r.c, r.cfg, r.teacher).values())
        peak = memory_measure.fake_peak_memory(r.c, r.cfg, r.teacher)
        lines.append([r.name, 'FSDP' if r.c.fsdp else 'DDP', r.micro, f'{plan / 2**30:.1f} GiB',
                      f'{peak / 2**30:.1f} GiB', f'{plan / peak:.3f}x'])
    return (f'The plan (train.py --dry_run: {GPUS} GPUs, bfloat16, each config\'s mode and '
            'micro-batch) against MemTracker\'s peak of a training micro-step on fake tensors at '
            'full depth (memory_measure.fake_peak_memory):\n\n'
            + table(header, lines))


def tables():
    """{marker name: the markdown text between its markers}."""
    found = rows()
    return {'params': params_table(found), 'plan-per-row': plan_table(found),
            'plan-totals': totals_table(found),
            'multi-node': multi_node_table(found), 'flops': flops_table(found),
            'readme-sizes': readme_table(found),
            'dry-run-affine-3b': dry_run_example(), 'onegpu': onegpu_table()}


def doc_files():
    return [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def regenerate(text, generated):
    """text with every marked block replaced by its generated table; unknown marker names are an
    error."""
    def replace(match):
        name = match.group(1)
        if name not in generated:
            raise SystemExit(f'unknown table {name!r} (known: {", ".join(generated)})')
        return f'{START.format(name)}\n{generated[name]}\n{END.format(name)}'
    return MARKED.sub(replace, text)


def stale(generated):
    """(files whose marked blocks differ from the generated tables, table names no file holds)."""
    differ, used = [], set()
    for path in doc_files():
        text = open(path, encoding='utf-8').read()
        used.update(m.group(1) for m in MARKED.finditer(text))
        if regenerate(text, generated) != text:
            differ.append(os.path.relpath(path, ROOT))
    return differ, sorted(set(generated) - used)


def main(argv):
    args = parse(argv, dict(write=False, check=False, measure=False), __doc__,
                 prog='python -m tools.memory_tables')
    if args['measure']:
        print(measured_table(rows()))
        return 0
    generated = tables()
    if args['write']:
        for path in doc_files():
            text = open(path, encoding='utf-8').read()
            new = regenerate(text, generated)
            if new != text:
                with atomic_write(path) as f:
                    f.write(new)
                print(f'wrote {os.path.relpath(path, ROOT)}')
    elif args['check']:
        differ, unused = stale(generated)
        for path in differ:
            print(f'{path}: its tables differ from the code; run python -m tools.memory_tables '
                  '--write')
        for name in unused:
            print(f'table {name} is in no file')
        return 1 if differ or unused else 0
    else:
        for name, text in generated.items():
            print(f'{START.format(name)}\n{text}\n{END.format(name)}\n')
    return 0


if __name__ == '__main__':
    sys.exit(run_script(main))
