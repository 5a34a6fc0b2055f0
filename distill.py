"""Knowledge distillation, as the paper trains every student (Sections 2.1 and 5.1), the way
model.py is its network: the teacher (load_teacher; check_compatibility against the data and the
student), the KD loss written as its definition (kd_loss) and computed in chunks without the full
logits (fused_kd_loss), a micro-batch's loss (compute_loss: CE or KD), and, run as a script, a
teacher's sanity check before a long run: does it load, fit the data, predict its val split well?
docs/training.md, "The KD loss", has the formula, the memory and the precision.

    python distill.py --teacher=checkpoints/Llama-3.2-3B --data_dir=data/fineweb_edu_llama3
    python distill.py --teacher=out/teacher --data_dir=data/builtin_bytes --block_size=256  # ours
"""
import functools
import math
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

import lmkit  # noqa: F401  (first: it makes idle OpenMP threads sleep, lmkit/__init__.py)
import torch
import torch.nn.functional as F

from attention_kernels import at_least_fp32
from configurator import DEVICE, Key, parse
from lmkit.checkpoint import checkpoint_file, read_checkpoint, read_hf_config
from lmkit.data import Windows, read_meta
from lmkit.distributed import autocast, resolve_device, resolve_dtype
from lmkit.errors import RunError, run_script
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from model import GPT, IGNORE_INDEX

CHUNK_LOGITS = 2 ** 26  # float32 logits per chunk of fused_kd_loss: 256 MB

# -----------------------------------------------------------------------------
# Teachers


def load_teacher(spec, device='cpu', dtype=torch.float32):
    """The teacher (GPT.from_pretrained: a Hugging Face directory or one of our checkpoints) on
    device, in dtype, in eval mode, every parameter frozen; a file that does not load is one line
    naming it, not a traceback."""
    try:
        model = GPT.from_pretrained(spec, dtype=dtype, device=device)
    # unreadable file, unsupported config, tensors that do not fit
    except (OSError, ValueError, RuntimeError) as e:
        raise RunError(f"teacher {spec}: {e}") from e
    return model.eval().requires_grad_(False)


def teacher_tokenizer_info(spec):
    """The teacher's tokenizer as prepare_data.py's meta.json records it (its sha256 identifies it):
    rebuilt from a Hugging Face directory's tokenizer files, or the dict stored in one of this
    repo's checkpoints."""
    path = checkpoint_file(spec)
    if path is None:  # export_hf.py records the run's tokenizer in config.json
        return (read_hf_config(spec).get('tokenizer_info')
                or tokenizer_info(load_tokenizer(spec), spec))
    return read_checkpoint(path)['tokenizer']


def check_compatibility(teacher, teacher_spec, student_config, data_meta, block_size):
    """Before step 0: RunError listing every way the teacher does not fit the data (its meta.json),
    the student (a ModelConfig; None checks the teacher against the data only) and the sequence
    length."""
    data_tok, teacher_tok = data_meta['tokenizer'], teacher_tokenizer_info(teacher_spec)
    n_vocab, teacher_rows = data_meta['vocab_size'], teacher.config.vocab_size
    problems = []
    if teacher_tok['sha256'] != data_tok['sha256']:
        problems.append(f"its tokenizer ({teacher_tok['family']}, {teacher_tok['n_vocab']:,} "
                        f"tokens, from {teacher_tok['spec']}) is not the one the data was "
                        f"tokenized with ({data_tok['family']}, {data_tok['n_vocab']:,} tokens, "
                        f"from {data_tok['spec']}); re-run prepare_data.py with --tokenizer=<the "
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

# -----------------------------------------------------------------------------------------------
# The KD loss: as its definition (kd_loss), and fused with both lm_heads, chunked over tokens
# (fused_kd_loss)


def kd_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, temperature=1.0,
            targets=None, kd_alpha=1.0):
    """The loss fused_kd_loss computes, written as its definition: both models' full (N, V) logits,
    then KD = T^2 * mean over tokens of KL(teacher || student) at temperature T, and CE on the
    student's logits, with autograd taking the gradients. Same arguments and results as
    fused_kd_loss; the softmaxes run in at least float32. Readable, and what the tests and
    tools/bench.py check the fused loss against; it holds several (N, V) tensors at once, which
    fused_kd_loss never does (train.py --kd_loss=plain selects it)."""
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


def kd_compute_dtype(*tensors):
    """The dtype fused_kd_loss multiplies hidden states and lm_heads in: autocast's when autocast is
    on for the tensors' device type (float64 stays float64, which autocast leaves alone too), else
    their promoted dtype."""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type) and dtype != torch.float64:
        return torch.get_autocast_dtype(device_type)
    return dtype


@functools.cache
def fp32_output_gemm(device, dtype):
    """Whether torch.mm and torch.addmm(..., out=) take out_dtype=torch.float32 with dtype
    (bfloat16, float16) operands on device: the GEMM then writes its float32 accumulator out as it
    is, neither rounded to dtype nor copied. PyTorch has it from 2.8 on CUDA, through cuBLAS on
    sm_80 and newer (pytorch/pytorch#150812; older GPUs raise), and has no CPU kernel for it (2.13).
    Tried once per device and dtype rather than kept in a table."""
    a, acc = torch.ones(2, 2, device=device, dtype=dtype), torch.ones(2, 2, device=device)
    try:
        product = torch.mm(a, a, out_dtype=torch.float32)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    # no such overload (PyTorch < 2.8), no kernel (CPU), a GPU older than sm_80
    except (TypeError, RuntimeError):
        return False
    return (product.dtype == acc.dtype == torch.float32
            and bool((product == 2).all() and (acc == 3).all()))


def _mm(a, b, dtype):
    """a @ b as dtype, a and b in the compute dtype. From bf16 operands, float32 comes straight out
    of the GEMM's float32 accumulator where the device can (fp32_output_gemm); elsewhere the product
    is rounded to bf16 first and then cast, as autocast's bf16 logits are."""
    if a.dtype == dtype:
        return a @ b
    if dtype == torch.float32 and fp32_output_gemm(a.device, a.dtype):
        return torch.mm(a, b, out_dtype=dtype)
    return (a @ b).to(dtype)


def _add_mm(acc, a, b):
    """acc += a @ b: acc the float32 (float64) gradient of the lm_head, a and b in the compute
    dtype. Where the device can (fp32_output_gemm), the bf16 GEMM adds its float32 accumulator into
    acc in place: no temporary, no rounding. Elsewhere the product is rounded to bf16 (a V x C
    temporary) and then added in float32: one bf16 rounding per chunk's term, still at bf16 GEMM
    speed. Upcasting a and b instead would run this GEMM, a quarter of the loss's FLOPs, in plain
    float32 (~67 vs ~989 TFLOP/s on an H100)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif fp32_output_gemm(a.device, a.dtype):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc += a @ b


def _kd_chunk(h_s, w_s, h_t, w_t, y, valid, T, kd_alpha, acc, need_grad):
    """One chunk of FusedKDLoss: (KL summed over its tokens, CE summed likewise or None without
    targets, the gradient of kd_alpha * KD + (1 - kd_alpha) * CE w.r.t. the student's logits, or
    None without need_grad), tokens with valid = 0 left out and the 1/count of the means not
    applied. Hidden states and heads come in the compute dtype; the logits come out of their GEMMs
    in acc (float32), and everything after them stays in acc, in place where it can: at most 3 (n,
    V) tensors at once, 4 when T != 1 and kd_alpha < 1."""
    # the teacher's logits first, turned into log p before the student's exist
    t = _mm(h_t, w_t.T, acc)
    if T != 1:
        t.div_(T)
    log_p = torch.log_softmax(t, dim=-1)
    del t
    s = _mm(h_s, w_s.T, acc)
    ce = r = None
    if y is not None and T != 1:  # (with T = 1, CE takes log q below: softmax(s / T) is softmax(s))
        if kd_alpha == 1:  # CE is only logged: logsumexp(s) - s[y], no (n, V) log-softmax of s
            ce = torch.logsumexp(s, dim=-1, keepdim=True) - s.gather(1, y)
        else:  # CE's gradient softmax(s) - onehot(y) needs softmax(s) besides softmax(s / T)
            r = torch.log_softmax(s, dim=-1)
            ce = -r.gather(1, y)
            r = r.exp_()
    if T != 1:
        s.div_(T)
    log_q = torch.log_softmax(s, dim=-1)
    del s
    if y is not None and T == 1:
        ce = -log_q.gather(1, y)
    p = log_p.exp()
    # sum_v p (log p - log q), in log p's memory
    kl = log_p.sub_(log_q).mul_(p).sum(-1, keepdim=True)
    del log_p
    if valid is not None:
        kl, ce = kl * valid, ce * valid
    kl, ce = kl.sum(), None if ce is None else ce.sum()
    if not need_grad:
        return kl, ce, None
    grad = log_q.exp_()  # q, in log q's memory
    if T == 1:  # kd_alpha (q - p) + (1 - kd_alpha) (q - onehot(y))
        grad.sub_(p, alpha=kd_alpha)
    else:  # kd_alpha T (q - p) + (1 - kd_alpha) (softmax(s) - onehot(y))
        grad.sub_(p).mul_(kd_alpha * T)
        if r is not None:
            grad.add_(r, alpha=1 - kd_alpha)
    if kd_alpha < 1:
        grad.scatter_add_(1, y, grad.new_full(y.shape, kd_alpha - 1))
    if valid is not None:
        grad.mul_(valid)
    return kl, ce, grad


class FusedKDLoss(torch.autograd.Function):
    """loss = kd_alpha * KD + (1 - kd_alpha) * CE from final hidden states and lm_head weights, one
    chunk of tokens at a time. With q = softmax(s/T), p = softmax(t/T): KD = T^2 sum_v p (log p -
    log q), dKD/ds = T (q - p); CE = logsumexp(s) - s[y], dCE/ds = softmax(s) - onehot(y). Each
    chunk's logit gradient becomes the hidden states' and lm_head's gradients at once, so no logits
    outlive their chunk; backward only scales them, in place (a second backward is refused).
    Precision: docs/training.md, "The KD loss"."""

    @staticmethod
    def forward(ctx, h_s, w_s, h_t, w_t, targets, temperature, kd_alpha, chunk_size):
        T, shape, device = temperature, h_s.shape, h_s.device
        dtype = kd_compute_dtype(h_s, w_s, h_t, w_t)
        # logits, softmaxes, sums and the lm_head's gradient
        acc = torch.promote_types(dtype, torch.float32)
        h_s, h_t = h_s.flatten(0, -2), h_t.flatten(0, -2)  # (N, C_s), (N, C_t)
        N = h_s.size(0)
        with torch.autocast(device.type, enabled=False):  # every cast below is explicit
            # the heads in the compute dtype once per call, as autocast casts a plain lm_head; .to
            # is no copy for a head already in it (the bf16 teacher's)
            w_s_low, w_t_low = w_s.to(dtype), w_t.to(dtype)
            # KD and CE are means over the tokens whose target is not IGNORE_INDEX (all without
            # targets): sums here, divided by count; the gradients get the 1/count (and grad_output)
            # in backward
            valid, count = None, N
            if targets is not None:
                targets = targets.flatten()
                valid = (targets != IGNORE_INDEX).to(acc)[:, None]
                count = valid.sum().clamp(min=1)
            grad_h = torch.empty(h_s.shape, dtype=h_s.dtype,
                                 device=device) if ctx.needs_input_grad[0] else None
            grad_w = torch.zeros(w_s.shape, dtype=acc,
                                 device=device) if ctx.needs_input_grad[1] else None
            kd, ce = (torch.zeros((), dtype=acc, device=device),
                      torch.zeros((), dtype=acc, device=device))
            for i in range(0, N, chunk_size):
                j = i + chunk_size
                h = h_s[i:j].to(dtype)
                # ignored tokens: valid = 0
                y = None if targets is None else targets[i:j, None].clamp(min=0)
                kl, ce_sum, grad = _kd_chunk(h, w_s_low, h_t[i:j].to(dtype), w_t_low, y,
                                             None if valid is None else valid[i:j], T, kd_alpha,
                                             acc, grad_h is not None or grad_w is not None)
                kd += T * T * kl
                if ce_sum is not None:
                    ce += ce_sum
                if grad is not None:
                    # the GEMMs' operand, like autocast's bf16 gradient of bf16 logits
                    grad = grad.to(dtype)
                    if grad_h is not None:
                        grad_h[i:j] = _mm(grad, w_s_low, grad_h.dtype)
                    if grad_w is not None:
                        _add_mm(grad_w, grad.T, h)
                del grad  # freed now, not while the next chunk's logits are computed
            kd, ce = kd / count, ce / count
        ctx.save_for_backward(grad_h, grad_w)
        ctx.shape, ctx.count, ctx.weight_dtype = shape, count, w_s.dtype
        ctx.mark_non_differentiable(kd, ce)
        return kd_alpha * kd + (1 - kd_alpha) * ce, kd, ce

    @staticmethod
    def backward(ctx, grad_loss, grad_kd, grad_ce):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss / ctx.count  # float32: the means' 1/count times the upstream gradient
        if grad_h is not None:
            if grad_h.dtype == scale.dtype:
                grad_h.mul_(scale)
            else:  # bf16 hidden states: scaled in float32, not by a bf16-rounded factor
                grad_h = grad_h.to(scale.dtype).mul_(scale).to(grad_h.dtype)
            grad_h = grad_h.view(ctx.shape)
        if grad_w is not None:  # .to: no copy for a float32 master weight
            grad_w = grad_w.mul_(scale).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def fused_kd_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, temperature=1.0,
                  targets=None, kd_alpha=1.0, chunk_size=None):
    """(loss, kd, ce): loss = kd_alpha * KD + (1 - kd_alpha) * CE, a scalar whose gradients reach
    student_hidden and student_weight only (the teacher's inputs are constants); kd and ce are
    detached scalar tensors for logging (ce is None without targets; .item() them when logging, not
    every step). hidden: (B, T, C) or (N, C) final normed hidden states (model(idx,
    return_hidden=True)), weight: (V, C) lm_head weights with equal V. targets (B, T) or (N,): KD
    and CE are means over tokens whose target is not IGNORE_INDEX; without targets KD is the mean
    over all tokens and kd_alpha must be 1. chunk_size: tokens per chunk, by default as many as fit
    CHUNK_LOGITS float32 logits. The GEMMs run in kd_compute_dtype (the autocast dtype under
    autocast), the rest in float32; memory_plan.kd_loss_memory gives the memory it needs."""
    V, N = student_weight.size(0), student_hidden.shape[:-1].numel()
    if teacher_weight.size(0) != V:
        raise ValueError(f"student and teacher lm_heads have {V} and {teacher_weight.size(0)} "
                         "rows; KD needs equal vocabularies")
    if teacher_hidden.shape[:-1].numel() != N or (targets is not None and targets.numel() != N):
        raise ValueError(f"student hidden {tuple(student_hidden.shape)}, teacher hidden "
                         f"{tuple(teacher_hidden.shape)} and targets "
                         f"{None if targets is None else tuple(targets.shape)} differ in tokens")
    if temperature <= 0 or not 0 <= kd_alpha <= 1 or (kd_alpha < 1 and targets is None):
        raise ValueError("need temperature > 0, 0 <= kd_alpha <= 1, and targets when kd_alpha < 1; "
                         f"got temperature={temperature}, kd_alpha={kd_alpha}, "
                         f"targets={targets is not None}")
    chunk_size = chunk_size or max(1, CHUNK_LOGITS // V)
    # evaluation: a Function's forward cannot see that, so skip the gradient work
    if not torch.is_grad_enabled():
        student_hidden, student_weight = student_hidden.detach(), student_weight.detach()
    loss, kd, ce = FusedKDLoss.apply(student_hidden, student_weight, teacher_hidden, teacher_weight,
                                     targets, temperature, kd_alpha, chunk_size)
    return loss, kd, ce if targets is not None else None


def compute_loss(model, student, teacher, x, y, fused=True, temperature=1.0, kd_alpha=1.0,
                 teacher_timer=None):
    """(loss, KD, CE) of one micro-batch (x, y): loss to backpropagate, KD and CE detached for
    logging (zeros without a teacher). model: the module to call (compiled / DDP / FSDP); student:
    the GPT itself (its lm_head); teacher: None (cross-entropy) or a GPT in eval mode, its forward
    timed by teacher_timer (a DeviceTimer). fused: fused_kd_loss, else kd_loss."""
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


# -----------------------------------------------------------------------------------------------
# Both losses on a random problem: what tools/bench.py's kd section and tools/gpu_check.py's kd part
# time


def kd_problem(N, V, C_s, C_t, device, hidden_dtype):
    """Random hidden states and lm_heads of a student (C_s wide, hidden states in hidden_dtype, fp32
    head) and a teacher (C_t wide; bf16 on CUDA, as train.py loads it), and the two KD paths on
    them, each a function that runs one forward + backward (under bf16 autocast on CUDA) and returns
    the loss: 'naive', kd_loss (both models' full logits, then the KL; autocast computes the
    log-softmaxes in fp32), and 'fused_kd_loss'. What tools/bench.py's kd section and
    tools/gpu_check.py's kd part measure. Returns (h_s, w_s, paths); gradients land in h_s.grad and
    w_s.grad."""
    low = torch.bfloat16 if device.type == 'cuda' else torch.float32
    torch.manual_seed(0)
    h_s = torch.randn(N, C_s, device=device, dtype=hidden_dtype, requires_grad=True)
    w_s = (torch.randn(V, C_s, device=device) * C_s ** -0.5).requires_grad_()
    h_t = torch.randn(N, C_t, device=device, dtype=low)
    w_t = (torch.randn(V, C_t, device=device) * C_t ** -0.5).to(low)
    losses = dict(naive=lambda: kd_loss(h_s, w_s, h_t, w_t)[0],
                  fused_kd_loss=lambda: fused_kd_loss(h_s, w_s, h_t, w_t)[0])

    def step(loss_fn):
        h_s.grad = w_s.grad = None  # each step computes its gradients afresh
        with autocast(device):
            loss = loss_fn()
        loss.backward()
        return loss.detach()

    return h_s, w_s, {name: (lambda fn=fn: step(fn)) for name, fn in losses.items()}

# -----------------------------------------------------------------------------
# The teacher check (python distill.py)


KEYS = dict(
    teacher=Key(None, "Hugging Face checkpoint directory, or this repo's ckpt.pt (or a directory "
                      "holding it)",
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
    return SimpleNamespace(**parse(argv, KEYS,
                                   "Load a KD teacher, check it against a data directory and print "
                                   "its val loss.",
                                   prog='distill.py'))


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
        t0 = time.time()
        with torch.no_grad():
            _, loss = teacher(x[i:i + args.batch_size].to(device),
                              y[i:i + args.batch_size].to(device))
        total += loss.item() * y[i:i + args.batch_size].numel()
        print(f"batch {i // args.batch_size + 1}/{math.ceil(len(x) / args.batch_size)}: loss "
              f"{loss.item():.4f} ({time.time() - t0:.1f} s)")
    mean = total / y.numel()
    print(f"teacher val loss {mean:.4f}, perplexity {math.exp(mean):.2f} on {y.numel():,} tokens "
          f"of {args.data_dir}")
    return dict(loss=mean, perplexity=math.exp(mean), tokens=y.numel())


if __name__ == '__main__':
    run_script(main)
