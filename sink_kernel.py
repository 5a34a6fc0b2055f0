"""
The attention sink of Eq. 3 in O(T) memory with exact gradients, on PyTorch's own fused attention kernels.
model.sink_attention dispatches here on CPU and CUDA (and falls back to the explicit matrix elsewhere); the
model code never needs to know which backend-specific op ran.

The sink adds e^s to every softmax denominator. A flash kernel returns the output and
lse_i = logsumexp_j(q_i.k_j / sqrt(d)); with lse'_i = logaddexp(lse_i, s) the sink's output is
out * exp(lse - lse'). PyTorch exposes the LSE only through backend-specific aten ops: the CPU flash
kernel, CUDA FlashAttention-2 (fp16/bf16) and CUDA's memory-efficient kernel (fp32). The first two take
grouped K/V (fewer heads than q) and return dk, dv with K/V's heads; the third needs equal head counts
(model.kv_for_kernel decides which the model passes).
"""
import torch


def at_least_fp32(t):
    """Upcast half precision to float32 for norms, exponentials and sums; float64 stays float64."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def bthd(t):
    """t (B, H, T, D) with its memory laid out as (B, T, H, D): the layout of the model's q, k, v (one row of
    q_proj per token), in which the kernels then write their output. The same tensor, no copy, when t has it.
    CUDA's memory-efficient backward requires it of `out` without checking (it reads out's row stride as H * D)
    and copies grad_out into it otherwise; grad_out arrives in it from the model (o_proj reads y.transpose(1, 2)),
    so grad_out.contiguous() would cost two copies per layer: one away from it and the kernel's one back."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _flash_forward(q, k, v, is_causal):
    """Fused attention that also returns lse_i = logsumexp_j(q_i.k_j / sqrt(d)) over the visible keys.
    PyTorch exposes the LSE only through backend-specific aten ops; `state` is what that kernel's
    backward needs besides (q, k, v, out, lse)."""
    aten = torch.ops.aten
    if q.device.type == 'cpu':
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)
        return out, lse, ()
    if q.dtype in (torch.float16, torch.bfloat16):  # CUDA FlashAttention-2
        out, lse, *state, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal)
        return out, lse, tuple(state)  # cum_seq_q, cum_seq_k, max_q, max_k, philox seed, offset
    # CUDA float32: the memory-efficient kernel; its lse is padded along T (to a multiple of 32)
    out, lse_padded, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, is_causal)
    return out, lse_padded[..., :q.size(2)], (lse_padded, seed, offset)


def _flash_backward(grad_out, q, k, v, out, lse, is_causal, state):
    """(dq, dk, dv) from the kernel's own backward, for the output `out` and normaliser `lse` given."""
    aten = torch.ops.aten
    if q.device.type == 'cpu':
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, is_causal)
    if len(state) == 6:
        cum_q, cum_k, max_q, max_k, seed, offset = state
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, is_causal, seed, offset)
    lse_padded, seed, offset = state
    lse_padded = lse_padded.clone()
    lse_padded[..., :q.size(2)] = lse
    return aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse_padded, seed, offset, 0.0, [True, True, True, False], is_causal)[:3]


class SinkAttention(torch.autograd.Function):
    """Eq. 3 exactly, without a T x T matrix. The sink adds e^s to every softmax denominator, so with
    lse_i from a flash kernel:  out'_i = out_i * exp(lse_i - lse'_i),  lse'_i = logaddexp(lse_i, s).
    Backward: flash backward recomputes P = exp(S - lse') and uses rowsum(dO * O'), so handing it
    (O', lse') differentiates the sink-normalised weights exactly; and, with p_sink,i = exp(s - lse'_i),
    d s = -sum_i p_sink,i * rowsum(dO_i * O'_i)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, is_causal):
        out, lse, ctx.state = _flash_forward(q, k, v, is_causal)
        lse = at_least_fp32(lse)
        lse_sink = torch.logaddexp(lse, sinks.to(lse.dtype).view(1, -1, 1))
        out = bthd((at_least_fp32(out) * torch.exp(lse - lse_sink).unsqueeze(-1)).to(q.dtype))
        ctx.save_for_backward(q, k, v, sinks, out, lse_sink)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, sinks, out, lse_sink = ctx.saved_tensors
        grad_out = bthd(grad_out)
        dq, dk, dv = _flash_backward(grad_out, q, k, v, out, lse_sink, ctx.is_causal, ctx.state)
        p_sink = torch.exp(sinks.to(lse_sink.dtype).view(1, -1, 1) - lse_sink)
        dsinks = -(p_sink * (at_least_fp32(grad_out) * at_least_fp32(out)).sum(-1)).sum(dim=(0, 2))
        return dq, dk, dv, dsinks.to(sinks.dtype), None
