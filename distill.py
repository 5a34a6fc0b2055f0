"""Knowledge distillation, as the paper trains every student (Sections 2.1 and 5.1): loading the
teacher and checking it against the data and the student, the KD loss as its definition (kd_loss;
lmkit/fused_kd.py computes it in chunks) and a micro-batch's loss (compute_loss). As a script, it
checks that a teacher loads, fits the data and predicts its val split well (docs/training.md).

    python distill.py --teacher=checkpoints/Llama-3.2-3B --data_dir=data/fineweb_edu_llama3
    python distill.py --teacher=out/teacher --data_dir=data/builtin_bytes --block_size=256  # ours
"""
import math
import os
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch
import torch.nn.functional as F

from attention_kernels import at_least_fp32
from configurator import DEVICE, Key, parse
from lmkit.checkpoint import checkpoint_file, read_checkpoint, read_hf_config
from lmkit.data import Windows, read_meta
from lmkit.data_meta import files_mismatch, tokenizer_files
from lmkit.distributed import resolve_device, resolve_dtype
from lmkit.errors import RunError, run_script
from lmkit.fused_kd import fused_kd_loss
from model import GPT, IGNORE_INDEX


# Teachers -------------------------------------------------------------------------------------

def load_teacher(spec, device='cpu', dtype=torch.float32):
    """The teacher, a Hugging Face directory or one of our checkpoints (GPT.from_pretrained), on
    device in dtype, in eval mode and frozen; a file that does not load is named in a RunError."""
    try:
        model = GPT.from_pretrained(spec, dtype=dtype, device=device)
    except (OSError, ValueError, RuntimeError) as e:  # unreadable, unsupported, or does not fit
        raise RunError(f"teacher {spec}: {e}") from e
    return model.eval().requires_grad_(False)


def teacher_tokenizer_info(spec):
    """The tokenizer record, as meta.json's, of our checkpoint or export; None for another model."""
    if (path := checkpoint_file(spec)) is None:
        return read_hf_config(spec).get('tokenizer_info')
    return read_checkpoint(path)['tokenizer']


def check_compatibility(teacher, teacher_spec, student_config, data_meta, block_size):
    """Check before step 0 that the teacher fits the data (meta.json), the student (a ModelConfig,
    or None for the data only) and block_size; a RunError lists every way it does not."""
    data_tok, teacher_tok = data_meta['tokenizer'], teacher_tokenizer_info(teacher_spec)
    data = f"{data_tok['family']}, {data_tok['n_vocab']:,} tokens, from {data_tok['spec']}"
    n_vocab, teacher_rows = data_meta['vocab_size'], teacher.config.vocab_size
    problems = []
    if teacher_tok is None:  # a Hugging Face directory, checked by its files (no tokenizer rebuild)
        if mismatch := files_mismatch(tokenizer_files(teacher_spec), data_tok):
            problems.append(
                f"its tokenizer files are not known to build the data's tokenizer ({data}): "
                f"{mismatch}; if the teacher's tokenizer is the same, run prepare_data.py again on "
                f"this data_dir with --tokenizer={teacher_spec} and the same other arguments (it "
                "checks that the tokenizer is the same by its sha256, and records these files); "
                f"otherwise prepare the data with --tokenizer={teacher_spec}")
    elif teacher_tok['sha256'] != data_tok['sha256']:
        problems.append(f"its tokenizer ({teacher_tok['family']}, {teacher_tok['n_vocab']:,} "
                        f"tokens, from {teacher_tok['spec']}) is not the one the data was "
                        f"tokenized with ({data}); re-run prepare_data.py with --tokenizer=<the "
                        "teacher>")
    if n_vocab > teacher_rows:
        problems.append(f"the data has {n_vocab:,} token ids but the teacher's lm_head only "
                        f"{teacher_rows:,} rows")
    if student_config is not None:
        if n_vocab > student_config.vocab_size:
            problems.append(f"the data has {n_vocab:,} token ids but the student's vocab_size is "
                            f"{student_config.vocab_size:,}")
        if student_config.vocab_size != teacher_rows:
            problems.append(f"the student has {student_config.vocab_size:,} vocabulary rows, the "
                            f"teacher {teacher_rows:,}; KD compares the two distributions row by "
                            f"row: set the student's vocab_size={teacher_rows}")
    if block_size > teacher.config.block_size:
        problems.append(f"block_size={block_size} is longer than the teacher's "
                        f"{teacher.config.block_size} positions (its block_size, or "
                        "max_position_embeddings, or Mistral's sliding_window)")
    if problems:
        raise RunError(f"teacher {teacher_spec} does not fit:\n  - " + "\n  - ".join(problems))


# The KD loss, written as its definition (lmkit/fused_kd.py computes it in chunks) ------------

def kd_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, temperature=1.0,
            targets=None, kd_alpha=1.0):
    """(loss, kd, ce) from both models' full (N, V) logits: KD is T^2 times the mean over tokens of
    KL(teacher || student) at temperature T, CE the student's cross-entropy, and
    loss = kd_alpha * KD + (1 - kd_alpha) * CE. The tests and tools/bench.py hold fused_kd_loss
    (same arguments, train.py's default) to this one (docs/training.md, "The KD loss")."""
    T = temperature
    student = at_least_fp32(student_hidden @ student_weight.T)
    teacher = at_least_fp32(teacher_hidden @ teacher_weight.T).detach()
    kl = F.kl_div(F.log_softmax(student / T, -1), F.log_softmax(teacher / T, -1), log_target=True,
                  reduction='none').sum(-1)
    if targets is None:
        kd = T * T * kl.mean()
        return kd, kd.detach(), None
    kd = T * T * kl[targets != IGNORE_INDEX].mean()
    ce = F.cross_entropy(student.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)
    return kd_alpha * kd + (1 - kd_alpha) * ce, kd.detach(), ce.detach()


def compute_loss(model, student, teacher, x, y, fused=True, temperature=1.0, kd_alpha=1.0,
                 teacher_timer=None):
    """(loss, KD, CE) of one micro-batch (x, y): the loss to backpropagate, and KD and CE detached
    for logging (zeros without a teacher). model is the module to call (compiled, DDP or FSDP),
    student the GPT whose lm_head the loss reads, teacher None for cross-entropy or a GPT in eval
    mode whose forward teacher_timer (a DeviceTimer) times; fused picks fused_kd_loss or kd_loss."""
    if teacher is None:
        _, loss = model(x, y)
        zero = loss.detach().new_zeros(())
        return loss, zero, zero
    with teacher_timer() if teacher_timer else nullcontext(), torch.no_grad():
        teacher_hidden, _ = teacher(x, return_hidden=True)
    hidden, _ = model(x, return_hidden=True)
    return (fused_kd_loss if fused else kd_loss)(hidden, student.lm_head.weight, teacher_hidden,
                                                 teacher.lm_head.weight, temperature=temperature,
                                                 targets=y, kd_alpha=kd_alpha)


# The teacher check (python distill.py) -------------------------------------------------------

KEYS = dict(
    teacher=Key(None, "Hugging Face checkpoint directory, or this repo's ckpt.pt (or a directory "
                      "holding it)", types=(str,), required=True),
    data_dir=Key(None, "an output directory of prepare_data.py", types=(str,), required=True),
    batches=Key(8, "val batches to evaluate", min=1),
    batch_size=Key(4, "sequences per batch", min=1),
    block_size=Key(0, "tokens per sequence (0: min(2048, the teacher's))", min=0),
    device=DEVICE,
    dtype=Key('auto', "the teacher's dtype; auto: bfloat16 on GPUs that support it, else float32",
              choices=('auto', 'float32', 'bfloat16', 'float16')),
)


def parse_args(argv):
    return SimpleNamespace(**parse(argv, KEYS, "Load a KD teacher, check it against a data "
                                   "directory and print its val loss.", prog='distill.py'))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = resolve_device(args.device)
    meta = read_meta(args.data_dir)
    dtype = getattr(torch, resolve_dtype(args.dtype, device))
    t0 = time.time()
    teacher = load_teacher(args.teacher, device, dtype)
    cfg = teacher.config
    print(f"teacher {args.teacher}: {teacher.get_num_params():,} parameters, {cfg.n_layer} layers, "
          f"vocab {cfg.vocab_size:,} rows, up to {cfg.block_size:,} positions; {dtype} on "
          f"{device}, loaded in {time.time() - t0:.1f} s")
    block_size = args.block_size or min(2048, cfg.block_size)
    check_compatibility(teacher, args.teacher, None, meta, block_size)
    print(f"fits the data: tokenizer {meta['tokenizer']['family']} (sha256 "
          f"{meta['tokenizer']['sha256'][:12]}), {meta['vocab_size']:,} token ids, block_size "
          f"{block_size}")
    windows = Windows(args.data_dir, 'val', block_size)
    x, y = (torch.from_numpy(t)
            for t in windows.get(range(min(args.batches * args.batch_size, len(windows)))))
    total = 0.0
    for i in range(0, len(x), args.batch_size):
        t0, xb, yb = time.time(), x[i:i + args.batch_size], y[i:i + args.batch_size]
        with torch.no_grad():
            _, loss = teacher(xb.to(device), yb.to(device))
        total += loss.item() * yb.numel()
        print(f"batch {i // args.batch_size + 1}/{math.ceil(len(x) / args.batch_size)}: loss "
              f"{loss.item():.4f} ({time.time() - t0:.1f} s)")
    mean = total / y.numel()
    print(f"teacher val loss {mean:.4f}, perplexity {math.exp(mean):.2f} on {y.numel():,} tokens "
          f"of {args.data_dir}")
    return dict(loss=mean, perplexity=math.exp(mean), tokens=y.numel())


if __name__ == '__main__':
    run_script(main)
