"""
A KD teacher's sanity check before a long run: does it load, fit the data, and predict its val split well? The loss
and the teachers themselves live in lmkit/kd.py (docs/training.md, "The KD loss").

    python distill.py --teacher=checkpoints/Llama-3.2-3B --data_dir=data/fineweb_edu_llama3
    python distill.py --teacher=out/teacher --data_dir=data/builtin_bytes --block_size=256   # a run of this repo
"""
import math
import sys
import time
from types import SimpleNamespace

import lmkit  # noqa: F401  (first: it makes idle OpenMP threads sleep, lmkit/__init__.py)
import torch

from configurator import DEVICE, Key, parse
from lmkit.data import Windows, read_meta
from lmkit.device import resolve_device, resolve_dtype
from lmkit.errors import run_script
from lmkit.kd import check_compatibility
from lmkit.loading import load_teacher
from lmkit.kd import fused_kd_loss, kd_loss  # noqa: F401  (distill.fused_kd_loss: the public name it always had)


KEYS = dict(
    teacher=Key(None, "Hugging Face checkpoint directory, or this repo's ckpt.pt (or a directory holding it)",
                types=(str,), required=True),
    data_dir=Key(None, "an output directory of prepare_data.py", types=(str,), required=True),
    batches=Key(8, "val batches to evaluate", min=1),
    batch_size=Key(4, "sequences per batch", min=1),
    block_size=Key(0, "tokens per sequence (0: min(2048, the teacher's))", min=0),
    device=DEVICE,
    dtype=Key('auto', "the teacher's dtype; auto: bfloat16 on GPUs that support it, else float32",
              choices=('auto', 'float32', 'bfloat16', 'float16')),
)


def parse_args(argv):
    return SimpleNamespace(**parse(argv, KEYS, "Load a KD teacher, check it against a data directory and print its "
                                               "val loss.", prog='distill.py'))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = resolve_device(args.device)
    meta = read_meta(args.data_dir)
    dtype = getattr(torch, resolve_dtype(args.dtype, device))
    t0 = time.time()
    teacher = load_teacher(args.teacher, device, dtype)
    cfg = teacher.config
    print(f"teacher {args.teacher}: {teacher.get_num_params():,} parameters, {cfg.n_layer} layers, vocab "
          f"{cfg.vocab_size:,} rows, up to {cfg.block_size:,} positions; {dtype} on {device}, loaded in "
          f"{time.time() - t0:.1f} s")
    block_size = args.block_size or min(2048, cfg.block_size)
    check_compatibility(teacher, args.teacher, None, meta, block_size)
    print(f"fits the data: tokenizer {meta['tokenizer']['family']} (sha256 {meta['tokenizer']['sha256'][:12]}), "
          f"{meta['vocab_size']:,} token ids, block_size {block_size}")
    windows = Windows(args.data_dir, 'val', block_size)
    x, y = (torch.from_numpy(t) for t in windows.get(range(min(args.batches * args.batch_size, len(windows)))))
    total = 0.0
    for i in range(0, len(x), args.batch_size):
        t0 = time.time()
        with torch.no_grad():
            _, loss = teacher(x[i:i + args.batch_size].to(device), y[i:i + args.batch_size].to(device))
        total += loss.item() * y[i:i + args.batch_size].numel()
        print(f"batch {i // args.batch_size + 1}/{math.ceil(len(x) / args.batch_size)}: loss {loss.item():.4f} "
              f"({time.time() - t0:.1f} s)")
    mean = total / y.numel()
    print(f"teacher val loss {mean:.4f}, perplexity {math.exp(mean):.2f} on {y.numel():,} tokens of {args.data_dir}")
    return dict(loss=mean, perplexity=math.exp(mean), tokens=y.numel())


if __name__ == '__main__':
    run_script(main)
