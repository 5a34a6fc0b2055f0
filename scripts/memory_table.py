"""
The README's memory tables, generated rather than typed: train.py --dry_run's per-GPU plan (train.memory_estimate,
with the arguments the dry run gives it) for every paper row, config/*_0.5b.py, *_1b.py and *_3b.py, on 8 GPUs, as
Markdown. From the repository root:

    python scripts/memory_table.py                  # the plans: about a minute
    python scripts/memory_table.py --measure=True   # and each config's own mode measured at full depth: MemTracker's
                                                    # peak of a training micro-step on fake tensors (20-45 s a row)
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules

import bench  # noqa: E402 (after the path they are found on)
import train  # noqa: E402
from configurator import Key, parse  # noqa: E402
from files import run_script  # noqa: E402

KEYS = dict(
    measure=Key(False, "also measure each config's own mode (bench.fake_peak_memory at full depth)"),
    gpu_gib=Key(80.0, "memory of one GPU, for the verdict column", min=1),
)
COMPONENTS = dict(weights='weights', gradients='grads', optimizer='AdamW', teacher='teacher', kd_loss='KD loss',
                  activations='activations')
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


def gib(n_bytes):
    return f'{n_bytes / 2**30:.1f}'


def verdict(total, gpu_gib):
    """The dry run's (train.print_dry_run): fits with 10% of the GPU left, tight under it, else no."""
    return 'fits' if total <= 0.9 * gpu_gib * 2**30 else 'tight' if total <= gpu_gib * 2**30 else 'no'


def table(header, rows):
    print('| ' + ' | '.join(header) + ' |\n|' + '---|' * len(header))
    for row in rows:
        print('| ' + ' | '.join(row) + ' |')


def main(argv):
    args = parse(argv, KEYS, __doc__, prog='memory_table.py')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(p for p in glob.glob(os.path.join(root, 'config', '*.py'))
                   if p.endswith(('_0.5b.py', '_1b.py', '_3b.py')))
    configs = {os.path.basename(path)[:-3]: train.load_config([path]) for path in paths}
    rows = []
    for name, c in configs.items():
        student, teacher = bench.planned_models(c)
        for fsdp in (False, True):
            estimate = bench.memory_plan(c | dict(fsdp=fsdp), student, teacher)
            total = sum(estimate.values())
            row = [name, ('FSDP' if fsdp else 'DDP') + (' (config)' if fsdp == c['fsdp'] else ''),
                   str(c['micro_batch_size']), *(gib(estimate.get(key, 0)) for key in COMPONENTS), f'**{gib(total)}**',
                   verdict(total, args['gpu_gib'])]
            if args['measure']:
                peak = bench.fake_peak_memory(c, student, teacher) if fsdp == c['fsdp'] else None
                row.append(f'{gib(peak)} (plan {total / peak:.3f}x)' if peak else '-')
            rows.append(row)
    c = next(iter(configs.values()))
    print(f"Per-GPU memory plan of every paper row (train.py --dry_run: {c['dry_run_world_size']} GPUs, bfloat16, "
          f"global_batch_size={c['global_batch_size']}, {c['block_size']:,} tokens, each config's micro-batch; "
          f"\"(config)\" marks the mode the config file selects; GiB per GPU; the verdict on {args['gpu_gib']:g} GiB "
          f"leaves 10% for the CUDA context, NCCL and fragmentation" + ("; measured: MemTracker's peak of a training "
          "micro-step on fake tensors at full depth, bench.fake_peak_memory, and the plan's ratio to it" if
          args['measure'] else '') + "):\n")
    table(['row', 'mode', 'micro-batch', *COMPONENTS.values(), '**total**', f"{args['gpu_gib']:g} GiB"]
          + (['measured (fake tensors)'] if args['measure'] else []), rows)

    rows = []
    for name, c in configs.items():
        student, teacher = bench.planned_models(c)
        total = lambda **overrides: sum(bench.memory_plan(c | overrides, student, teacher).values())
        modes = [dict(fsdp=fsdp, activation_checkpointing=ac) for fsdp in (False, True) for ac in (False, True)]
        totals = [total(**mode) for mode in modes]
        fits = lambda **overrides: verdict(total(**overrides), args['gpu_gib']) == 'fits'
        largest = [max((b for b in MICRO_BATCHES if fits(micro_batch_size=b, **mode)), default=None) for mode in modes]
        rows.append([f"{name} (micro-batch {c['micro_batch_size']})",
                     *(f"{gib(t)} ({verdict(t, args['gpu_gib'])})" for t in totals),
                     ' / '.join(str(b) if b else '-' for b in largest)])
    print(f"\nTotals with and without activation checkpointing, and the largest micro-batch of "
          f"{', '.join(map(str, MICRO_BATCHES))} that fits:\n")
    table(['row', 'DDP', 'DDP + act. ckpt', 'FSDP', 'FSDP + act. ckpt',
           'largest micro-batch that fits (DDP / DDP+AC / FSDP / FSDP+AC)'], rows)


if __name__ == '__main__':
    run_script(main)
