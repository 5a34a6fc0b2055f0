"""fused_kd_loss: the KD loss of distill.kd_loss without the full logits, train.py's default. Each
chunk of tokens turns its logits into the loss and the student's gradients at once and frees them
before the next chunk's; backward only scales the gradients. docs/training.md, "The KD loss", has
the formula and the precision; docs/memory.md, "The fused KD loss", what it allocates."""
import functools

import torch

from model import IGNORE_INDEX

CHUNK_LOGITS = 2 ** 26  # the float32 logits of one chunk (256 MB), fused_kd_loss's default


@functools.cache
def fp32_output_gemm(device, dtype):
    """Whether torch.mm and torch.addmm take out_dtype=torch.float32 with bf16 (or fp16) operands,
    writing the GEMM's float32 accumulator out as it is. PyTorch has them from 2.8 on CUDA sm_80+;
    older versions, older GPUs and the CPU raise. Trying once per device keeps no version table."""
    a, acc = torch.ones(2, 2, device=device, dtype=dtype), torch.zeros(2, 2, device=device)
    try:
        torch.mm(a, a, out_dtype=torch.float32)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError):  # TypeError: no such argument before PyTorch 2.8
        return False
    return True


def _mm(a, b, dtype):
    """a @ b in dtype. From bf16 operands the float32 product comes straight out of the GEMM's
    accumulator where the device can, and is rounded to bf16 first elsewhere, as autocast's logits
    are: upcast operands would run in plain float32 (67 against 989 TFLOP/s on an H100)."""
    if a.dtype == dtype:
        return a @ b
    if dtype == torch.float32 and fp32_output_gemm(a.device, a.dtype):
        return torch.mm(a, b, out_dtype=dtype)
    return (a @ b).to(dtype)


def _add_mm(acc, a, b):
    """acc += a @ b into the lm_head's float32 gradient acc, as _mm computes a @ b: in place from
    bf16 operands where the device can, else through a bf16 V x C product."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif fp32_output_gemm(a.device, a.dtype):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc += a @ b


def _kd_chunk(h_s, w_s, h_t, w_t, y, valid, T, kd_alpha, acc, need_grad):
    """One chunk of FusedKDLoss: the KL and CE summed over the tokens whose valid is 1 (CE 0 without
    targets y), and the loss's gradient in the student's logits s if need_grad. Working in place
    where it can, it keeps at most 3 (n, V) tensors at once, 4 if T != 1 and kd_alpha < 1."""
    t = _mm(h_t, w_t.T, acc)
    log_p = torch.log_softmax(t if T == 1 else t.div_(T), dim=-1)
    del t  # before the student's logits exist
    s = _mm(h_s, w_s.T, acc)
    ce = softmax_s = None  # CE is -log softmax(s)[y]: at T = 1, log q below gives it
    if y is not None and T != 1:
        if kd_alpha == 1:  # a CE only logged needs no (n, V) log-softmax
            ce = torch.logsumexp(s, dim=-1, keepdim=True) - s.gather(1, y)
        else:  # a CE in the gradient needs softmax(s) beside softmax(s / T)
            softmax_s = torch.log_softmax(s, dim=-1)
            ce = -softmax_s.gather(1, y)
            softmax_s.exp_()
    log_q = torch.log_softmax(s if T == 1 else s.div_(T), dim=-1)
    del s
    if y is not None and T == 1:
        ce = -log_q.gather(1, y)
    p = log_p.exp()
    kl = log_p.sub_(log_q).mul_(p).sum(-1, keepdim=True)  # sum_v p (log p - log q), over log p
    del log_p
    if valid is not None:
        kl, ce = kl * valid, ce * valid
    kl, ce = kl.sum(), kl.new_zeros(()) if ce is None else ce.sum()
    if not need_grad:
        return kl, ce, None
    grad = log_q.exp_()  # q, over log q
    if T == 1:  # kd_alpha (q - p) + (1 - kd_alpha) (q - onehot(y))
        grad.sub_(p, alpha=kd_alpha)
    else:  # kd_alpha T (q - p) + (1 - kd_alpha) (softmax(s) - onehot(y))
        grad.sub_(p).mul_(kd_alpha * T)
        if softmax_s is not None:
            grad.add_(softmax_s, alpha=1 - kd_alpha)
    if kd_alpha < 1:
        grad.scatter_add_(1, y, grad.new_full(y.shape, kd_alpha - 1))
    if valid is not None:
        grad.mul_(valid)
    return kl, ce, grad


class FusedKDLoss(torch.autograd.Function):
    """loss = kd_alpha * KD + (1 - kd_alpha) * CE. With q = softmax(s / T) and p = softmax(t / T),
    KD = T^2 sum_v p (log p - log q) and dKD/ds = T (q - p); CE = logsumexp(s) - s[y] and dCE/ds =
    softmax(s) - onehot(y). Backward scales the forward's gradients in place: it can run once."""

    @staticmethod
    def forward(ctx, h_s, w_s, h_t, w_t, targets, temperature, kd_alpha, chunk_size):
        T, shape, device = temperature, h_s.shape, h_s.device
        # the GEMMs' dtype: the inputs', or autocast's where it is on (which leaves float64 alone)
        dtype = functools.reduce(torch.promote_types, (h_s.dtype, w_s.dtype, h_t.dtype, w_t.dtype))
        if torch.is_autocast_enabled(device.type) and dtype != torch.float64:
            dtype = torch.get_autocast_dtype(device.type)
        acc = torch.promote_types(dtype, torch.float32)  # of the logits, softmaxes, sums and grad_w
        h_s, h_t = h_s.flatten(0, -2), h_t.flatten(0, -2)  # (N, C_s), (N, C_t)
        N = h_s.size(0)
        with torch.autocast(device.type, enabled=False):  # every cast below is explicit
            # cast once per call, as autocast casts a plain lm_head (the bf16 teacher's stays as is)
            w_s_low, w_t_low = w_s.to(dtype), w_t.to(dtype)
            # KD and CE are means over the tokens whose target is not IGNORE_INDEX (all of them
            # without targets): sums here, and backward applies the 1/count to the gradients
            valid, count = None, N
            if targets is not None:
                targets = targets.flatten()
                valid = (targets != IGNORE_INDEX).to(acc)[:, None]
                count = valid.sum().clamp(min=1)
            need_h, need_w = ctx.needs_input_grad[:2]
            grad_h = torch.empty(h_s.shape, dtype=h_s.dtype, device=device) if need_h else None
            grad_w = torch.zeros(w_s.shape, dtype=acc, device=device) if need_w else None
            kd, ce = (torch.zeros((), dtype=acc, device=device) for _ in range(2))
            for i in range(0, N, chunk_size):
                j = i + chunk_size
                h = h_s[i:j].to(dtype)
                # an ignored target reads row 0, and valid = 0 leaves it out
                y = None if targets is None else targets[i:j, None].clamp(min=0)
                kl, ce_sum, grad = _kd_chunk(h, w_s_low, h_t[i:j].to(dtype), w_t_low, y,
                                             None if valid is None else valid[i:j], T, kd_alpha,
                                             acc, need_h or need_w)
                kd += T * T * kl
                ce += ce_sum
                if grad is not None:
                    grad = grad.to(dtype)  # the GEMMs' operand, as autocast's bf16 gradient is
                    if need_h:
                        grad_h[i:j] = _mm(grad, w_s_low, grad_h.dtype)
                    if need_w:
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
        scale = grad_loss / ctx.count  # float32: a bf16 grad_h is not scaled by a bf16 factor
        if grad_h is not None:
            grad_h = grad_h.to(scale.dtype).mul_(scale).to(grad_h.dtype).view(ctx.shape)
        if grad_w is not None:
            grad_w = grad_w.mul_(scale).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def fused_kd_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, temperature=1.0,
                  targets=None, kd_alpha=1.0, chunk_size=None):
    """(loss, kd, ce): loss = kd_alpha * KD + (1 - kd_alpha) * CE, whose gradients reach
    student_hidden and student_weight only, and kd and ce as detached scalars to log (ce None
    without targets; call .item() when logging, not at every step). The hidden states are the final
    normed ones, (B, T, C) or (N, C), and the weights (V, C) lm_heads. KD and CE are means over the
    tokens whose target is not IGNORE_INDEX, or without targets (kd_alpha = 1) over all."""
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
    # a Function's forward cannot see that gradients are off (evaluation): detached inputs tell it
    if not torch.is_grad_enabled():
        student_hidden, student_weight = student_hidden.detach(), student_weight.detach()
    loss, kd, ce = FusedKDLoss.apply(student_hidden, student_weight, teacher_hidden, teacher_weight,
                                     targets, temperature, kd_alpha, chunk_size)
    return loss, kd, ce if targets is not None else None
