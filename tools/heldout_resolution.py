"""
How small a held-out loss difference a set of validation windows resolves (docs/analysis.md, v4):
two runs' per-window mean token losses on the same windows, and the 95% half-width of their mean
difference, 1.96 sd(d) / sqrt(N), for each N asked. That is the evaluation's own noise, windows
taken as independent; the study's paired test across seeds decides a claim.

    python -m tools.heldout_resolution --runs=out/a,out/b --data_dir=data/stdlib_bytes
"""
import math
import os
import statistics
import sys
import types

from configurator import Key, parse
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from lmkit.errors import run_script

KEYS = dict(runs=Key(['', ''], "two train.py run directories (or checkpoints) to compare"),
            data_dir=Key('data/stdlib_bytes', "the prepared corpus whose val split is read"),
            first_token=Key('prefix', "what starts a window, as the runs trained",
                            choices=('stream', 'prefix')),
            block_size=Key(128, "tokens a window", min=2),
            windows=Key([128, 4096], "the set sizes N to report (v3's val_loss read 128)", min=2),
            batch_size=Key(64, "windows a forward", min=1))


def window_losses(model, windows, count, batch_size):
    """Each window's mean token cross-entropy, for the first `count` windows."""
    import torch
    import torch.nn.functional as F
    out = []
    with torch.no_grad():
        for start in range(0, count, batch_size):
            x, y = (torch.from_numpy(a) for a in windows.get(range(start,
                                                                   min(count, start + batch_size))))
            logits = model(x)[0].float()
            out += F.cross_entropy(logits.transpose(1, 2), y, reduction='none').mean(1).tolist()
    return out


def main(argv=None):
    args = types.SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS,
                                         __doc__.split('\n\n')[1],
                                         prog='python -m tools.heldout_resolution'))
    if len(args.runs) != 2 or not all(args.runs):
        raise SystemExit("heldout_resolution: --runs takes two run directories, a,b")
    from lmkit.data import Windows, first_token_id, read_meta
    from model import GPT
    first = first_token_id(args.first_token, read_meta(args.data_dir)['tokenizer'])
    windows = Windows(args.data_dir, 'val', args.block_size, first)
    count = min(max(args.windows), len(windows))
    a, b = (window_losses(GPT.from_pretrained(run).eval(), windows, count, args.batch_size)
            for run in args.runs)
    differences = [x - y for x, y in zip(a, b)]
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    print(f"{args.runs[0]} - {args.runs[1]} over {count} windows: mean difference {mean:.5f}, "
          f"sd over windows {sd:.5f}")
    print("| windows | tokens | 95% half-width of the mean difference |\n|---|---|---|")
    for n in sorted(args.windows):
        n = min(n, count)
        half = 1.96 * statistics.stdev(differences[:n]) / math.sqrt(n)
        print(f"| {n:,} | {n * args.block_size:,} | {half:.5f} |")


if __name__ == '__main__':
    run_script(main)
