"""The KD loss of distill.kd_loss, computed without the full logits: fused_kd_loss. It goes through
the tokens one chunk at a time. Each chunk's logits come out of both lm_heads, turn into the loss
and the gradients of the student's hidden states and lm_head, and are freed before the next
chunk's. The gradients are thus ready at the end of the forward, and backward only scales them.
distill.py imports fused_kd_loss, and train.py uses it by default (--kd_loss=fused).
docs/training.md, "The KD loss", has the formula, the memory and the precision;
lmkit/memory_plan.py's kd_loss_memory counts its bytes.
"""
import functools

import torch

from model import IGNORE_INDEX

CHUNK_LOGITS = 2 ** 26  # the float32 logits of one chunk (256 MB), fused_kd_loss's default


def kd_compute_dtype(*tensors):
    """The dtype fused_kd_loss multiplies hidden states and lm_heads in: autocast's where autocast
    is on for the tensors' device type, else their promoted dtype. float64 stays float64, as
    autocast leaves it too."""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type) and dtype != torch.float64:
        return torch.get_autocast_dtype(device_type)
    return dtype


@functools.cache
def fp32_output_gemm(device, dtype):
    """Whether torch.mm and torch.addmm(..., out=) on the device take out_dtype=torch.float32 with
    operands in dtype (bfloat16 or float16). The GEMM then writes its float32 accumulator out as it
    is, neither rounded to dtype nor copied. PyTorch has this from 2.8 on CUDA, through cuBLAS on
    sm_80 and newer (pytorch/pytorch#150812; older GPUs raise), and has no CPU kernel for it (2.13).
    The probe runs once per device and dtype, so no table of versions has to be kept."""
    a, acc = torch.ones(2, 2, device=device, dtype=dtype), torch.ones(2, 2, device=device)
    try:
        product = torch.mm(a, a, out_dtype=torch.float32)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError):  # PyTorch < 2.8 has no such overload; a CPU, no kernel
        return False
    return (product.dtype == acc.dtype == torch.float32
            and bool((product == 2).all() and (acc == 3).all()))


def _mm(a, b, dtype):
    """a @ b in dtype, with a and b in the compute dtype. From bf16 operands the float32 product
    comes straight out of the GEMM's accumulator where the device can (fp32_output_gemm).
    Elsewhere the product is rounded to bf16 and then cast, as autocast's bf16 logits are."""
    if a.dtype == dtype:
        return a @ b
    if dtype == torch.float32 and fp32_output_gemm(a.device, a.dtype):
        return torch.mm(a, b, out_dtype=dtype)
    return (a @ b).to(dtype)


def _add_mm(acc, a, b):
    """acc += a @ b, where acc is the lm_head's float32 (or float64) gradient and a and b are in
    the compute dtype. Where the device can (fp32_output_gemm), the bf16 GEMM adds its float32
    accumulator into acc in place, with no temporary and no rounding. Elsewhere the product is
    rounded to bf16 in a V x C temporary and then added in float32: one rounding per chunk, at bf16
    GEMM speed. Upcasting a and b instead would run this GEMM, a quarter of the loss's FLOPs, in
    plain float32 (about 67 against 989 TFLOP/s on an H100)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif fp32_output_gemm(a.device, a.dtype):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc += a @ b


def _kd_chunk(h_s, w_s, h_t, w_t, y, valid, T, kd_alpha, acc, need_grad):
    """One chunk of FusedKDLoss. Returns the KL summed over the chunk's tokens, the CE summed
    likewise (None without targets y), and the gradient of kd_alpha * KD + (1 - kd_alpha) * CE
    with respect to the student's logits (None without need_grad). Tokens with valid = 0 are left
    out, and the means' 1/count is not applied yet. Hidden states and heads come in the compute
    dtype, and the logits come out of their GEMMs in acc (float32). Everything after the GEMMs stays
    in acc and is computed in place where it can be, so that at most 3 (n, V) tensors are alive at
    once, or 4 when T != 1 and kd_alpha < 1."""
    # the teacher's logits first, turned into log p before the student's logits exist
    t = _mm(h_t, w_t.T, acc)
    if T != 1:
        t.div_(T)
    log_p = torch.log_softmax(t, dim=-1)
    del t
    s = _mm(h_s, w_s.T, acc)
    ce = r = None
    if y is not None and T != 1:  # with T = 1, softmax(s / T) is softmax(s): CE reads log q below
        if kd_alpha == 1:  # CE is only logged, as logsumexp(s) - s[y], with no (n, V) log-softmax
            ce = torch.logsumexp(s, dim=-1, keepdim=True) - s.gather(1, y)
        else:  # CE's gradient softmax(s) - onehot(y) needs softmax(s) beside softmax(s / T)
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
    kl = log_p.sub_(log_q).mul_(p).sum(-1, keepdim=True)  # sum_v p (log p - log q), in log p
    del log_p
    if valid is not None:
        kl, ce = kl * valid, ce * valid
    kl, ce = kl.sum(), None if ce is None else ce.sum()
    if not need_grad:
        return kl, ce, None
    grad = log_q.exp_()  # q, written over log q
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
    """loss = kd_alpha * KD + (1 - kd_alpha) * CE from the final hidden states and the lm_head
    weights, one chunk of tokens at a time. With q = softmax(s/T) and p = softmax(t/T), KD = T^2
    sum_v p (log p - log q) and dKD/ds = T (q - p); CE = logsumexp(s) - s[y] and dCE/ds = softmax(s)
    - onehot(y). Each chunk's logit gradient becomes the hidden states' and the lm_head's gradients
    at once, so no logits outlive their chunk. Backward only scales those gradients, in place, so a
    second backward is refused. docs/training.md, "The KD loss", covers the precision."""

    @staticmethod
    def forward(ctx, h_s, w_s, h_t, w_t, targets, temperature, kd_alpha, chunk_size):
        T, shape, device = temperature, h_s.shape, h_s.device
        dtype = kd_compute_dtype(h_s, w_s, h_t, w_t)
        # the dtype of the logits, softmaxes, sums and the lm_head's gradient
        acc = torch.promote_types(dtype, torch.float32)
        h_s, h_t = h_s.flatten(0, -2), h_t.flatten(0, -2)  # (N, C_s), (N, C_t)
        N = h_s.size(0)
        with torch.autocast(device.type, enabled=False):  # every cast below is explicit
            # the heads in the compute dtype, once per call, as autocast casts a plain lm_head; .to
            # makes no copy of a head already in it (the bf16 teacher's)
            w_s_low, w_t_low = w_s.to(dtype), w_t.to(dtype)
            # KD and CE are means over the tokens whose target is not IGNORE_INDEX (over all of
            # them without targets). Here they are sums, divided by count at the end; backward
            # applies 1/count and grad_output to the gradients.
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
                # an ignored target reads row 0, and valid = 0 leaves it out
                y = None if targets is None else targets[i:j, None].clamp(min=0)
                kl, ce_sum, grad = _kd_chunk(h, w_s_low, h_t[i:j].to(dtype), w_t_low, y,
                                             None if valid is None else valid[i:j], T, kd_alpha,
                                             acc, grad_h is not None or grad_w is not None)
                kd += T * T * kl
                if ce_sum is not None:
                    ce += ce_sum
                if grad is not None:
                    # the GEMMs' operand in the compute dtype, as autocast's bf16 gradient of bf16
                    # logits is
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
            else:  # bf16 hidden states are scaled in float32, not by a factor rounded to bf16
                grad_h = grad_h.to(scale.dtype).mul_(scale).to(grad_h.dtype)
            grad_h = grad_h.view(ctx.shape)
        if grad_w is not None:  # .to makes no copy for a float32 master weight
            grad_w = grad_w.mul_(scale).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def fused_kd_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, temperature=1.0,
                  targets=None, kd_alpha=1.0, chunk_size=None):
    """(loss, kd, ce), where loss = kd_alpha * KD + (1 - kd_alpha) * CE is a scalar whose gradients
    reach student_hidden and student_weight only; the teacher's inputs are constants. kd and ce are
    detached scalar tensors for logging (ce is None without targets); call .item() on them when
    logging, not at every step.

    The hidden states are (B, T, C) or (N, C) final normed hidden states, as model(idx,
    return_hidden=True) gives them, and the weights are (V, C) lm_heads with the same V. With
    targets, (B, T) or (N,), KD and CE are means over the tokens whose target is not IGNORE_INDEX;
    without them, KD is the mean over all tokens and kd_alpha must be 1. chunk_size is the tokens
    per chunk, by default as many as fit CHUNK_LOGITS float32 logits. The GEMMs run in
    kd_compute_dtype (the autocast dtype under autocast), and the rest in float32."""
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
    # A Function's forward cannot see that gradients are off, as in evaluation: detaching the
    # inputs tells it to skip the gradient work
    if not torch.is_grad_enabled():
        student_hidden, student_weight = student_hidden.detach(), student_weight.detach()
    loss, kd, ce = FusedKDLoss.apply(student_hidden, student_weight, teacher_hidden, teacher_weight,
                                     targets, temperature, kd_alpha, chunk_size)
    return loss, kd, ce if targets is not None else None
