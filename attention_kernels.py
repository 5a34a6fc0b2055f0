"""
Which kernel computes model.py's attention, kept apart from the math as nanochat's
flash_attention.py keeps it: softmax_attention (Eq. 1 on PyTorch's fused SDPA), sink_attention
(Eq. 3 in O(T) memory with exact gradients: SinkAttention), the explicit T x T forms every variant's
reference starts from, and KVCache. Paper: https://arxiv.org/abs/2602.23057, Sections 2.2-2.3.
"""
import math

import torch
import torch.nn.functional as F


def at_least_fp32(t):
    """Upcast half precision to float32 for norms, exponentials and sums; float64 stays float64."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# ----------------------------------------------------------------------------------------------
# Grouped-query attention (n_kv_head < n_head): the fused kernels get grouped K/V where they read
# the groups themselves, and K/V repeated to every query head where they do not.

def needs_repeated_kv(device_type, dtype):
    """True where the fused kernel cannot read grouped K/V: CUDA float32's memory-efficient kernel
    (torch <= 2.13; SDPA would fall back to a T x T matrix). Flash, cuDNN and CPU take groups."""
    return device_type == 'cuda' and dtype not in (torch.float16, torch.bfloat16)


def kv_for_kernel(q, k, v):
    """k, v (B, H_kv, T, D) as the fused kernel for q (B, H, T, D) takes them."""
    G = q.size(1) // k.size(1)
    if G > 1 and needs_repeated_kv(q.device.type, q.dtype):
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return k, v


def softmax_attention(q, k, v, visible):
    """Eq. 1, softmax(QK^T / sqrt(d)) V, on PyTorch's fused SDPA kernels. q (B, H, T, D), k and v
    (B, H_kv, T_k, D); visible: True (causal), False (every key) or a (B, 1, T, T_k) bool mask."""
    k, v = kv_for_kernel(q, k, v)
    mask, is_causal = (visible, False) if torch.is_tensor(visible) else (None, visible)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          enable_gqa=k.size(1) != q.size(1))


def sink_attention(q, k, v, sinks, visible):
    """Eq. 3: softmax attention with the learnable logit sinks[h] in every denominator of head h: in
    O(T) memory on CPU and CUDA (SinkAttention), as the explicit matrix elsewhere or with a mask."""
    if q.device.type in ('cpu', 'cuda') and not torch.is_tensor(visible):
        return SinkAttention.apply(q, *kv_for_kernel(q, k, v), sinks, visible)
    G = q.size(1) // k.size(1)  # the explicit matrix needs one K/V head per query head
    return sink_attention_explicit(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1),
                                   sinks, visible)


# ----------------------------------------------------------------------------------------------
# The KV cache: what a layer keeps of the tokens it has seen

class KVCache:
    """One layer's keys and values, and the sums a variant keeps (Variant.cache), for decoding and
    for scoring continuations of one context. Rows of a right-padded batch go on from their own."""

    def __init__(self, max_len):
        self.max_len, self.length, self.k, self.v = max_len, 0, None, None  # length: slots written
        self.real = None  # (B, max_len) bool: which written slots hold a real token (not padding)
        self.padded = False  # whether any written slot is padding (then masks, per-row positions)
        self.sums = {}  # name -> (B, H_kv, 1, D), over each row's real cached tokens (float32)

    def positions(self, T, device):
        """The positions of T new tokens: (T,), or (B, T) after padding."""
        new = torch.arange(T, device=device)
        if not self.padded:
            return new + self.length
        return self.real[:, :self.length].sum(1, keepdim=True) + new

    def update(self, k, v, seq_lens=None):
        """Append this call's k, v (B, H_kv, T, D); seq_lens: (B,) real tokens of right-padded rows.
        Returns every cached key and value and `visible`: True (causal), False (every key) or a
        (B, 1, T, T_k) mask (the row's real cached tokens, then this call's causally)."""
        B, _, T, _ = k.shape
        if self.k is None:  # allocate on first use, in the dtype/device the layer actually produces
            shape = (B, k.size(1), self.max_len, k.size(3))
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
            self.real = torch.zeros(B, self.max_len, dtype=torch.bool, device=k.device)
        if self.length + T > self.max_len:
            raise ValueError(f"a KV cache of {self.max_len} tokens holds {self.length}: no room "
                             f"for {T} more")
        start, self.length = self.length, self.length + T
        self.k[:, :, start:self.length], self.v[:, :, start:self.length] = k, v
        real = torch.ones(B, T, dtype=torch.bool, device=k.device)
        if seq_lens is not None:
            real = torch.arange(T, device=k.device) < seq_lens[:, None]
            self.padded = self.padded or bool((seq_lens < T).any())
        self.real[:, start:self.length] = real
        if start == 0 or (T == 1 and not self.padded):
            visible = start == 0
        else:  # padding only ever follows real tokens
            causal = torch.ones(T, T, dtype=torch.bool, device=k.device).tril()
            visible = torch.cat([self.real[:, None, None, :start].expand(B, 1, T, start),
                                 causal.expand(B, 1, T, T)], dim=-1)
        return self.k[:, :, :self.length], self.v[:, :, :self.length], visible

    def continue_sum(self, name, sums):
        """Running sums over new tokens (B, H_kv, T, D), padding 0, continued from the cache's."""
        sums = sums + self.sums.get(name, 0.0)
        self.sums[name] = sums[:, :, -1:]
        return sums

    def select(self, rows):
        """A cache of the given rows ((R,) indices, may repeat): a context per continuation."""
        cache = KVCache(self.max_len)
        cache.length, cache.padded = self.length, self.padded
        cache.k, cache.v, cache.real = self.k[rows], self.v[rows], self.real[rows]
        cache.sums = {name: s[rows] for name, s in self.sums.items()}
        return cache


# ----------------------------------------------------------------------------------------------
# The explicit T x T forms: the slow path

def attention_scores(q, k, visible=True):
    """QK^T / sqrt(d) as an explicit (B, H, T_q, T_k) matrix, at least float32, the keys a query
    does not see at -inf (visible as softmax_attention's): every explicit form starts here."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = at_least_fp32(q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if torch.is_tensor(visible):
        return scores.masked_fill(~visible, float('-inf'))
    if visible:
        T_q, T_k = scores.shape[-2:]
        later = torch.ones(T_q, T_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(later, float('-inf'))
    return scores


def sink_weights(scores, sinks):
    """Eq. 3 as a matrix: softmax over the (masked) scores plus one sink logit per head, whose
    column is then dropped; rows sum to less than 1 (the sink's own mass)."""
    sink_column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]


def sink_attention_explicit(q, k, v, sinks, visible):
    """Eq. 3 with the explicit T x T matrix: for devices without an LSE kernel (not CPU, CUDA)."""
    return sink_weights(attention_scores(q, k, visible), sinks).to(v.dtype) @ v


# -----------------------------------------------------------------------------------------------
# The sink in O(T) memory: a flash kernel's output corrected by its log-sum-exp, with exact
# gradients, on the aten ops that return the LSE: CPU flash, CUDA FlashAttention-2 (fp16/bf16) and
# CUDA's memory-efficient kernel (fp32, equal head counts: kv_for_kernel).

def bthd(t):
    """t (B, H, T, D) laid out as (B, T, H, D), the model's q, k, v layout (no copy if it is):
    CUDA's memory-efficient backward needs it of `out`, unchecked; grad_out arrives in it."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _flash_forward(q, k, v, is_causal):
    """(out, lse_i = logsumexp_j(q_i.k_j / sqrt(d)) over visible keys, state): `state` is what the
    kernel's backward needs besides (q, k, v, out, lse)."""
    aten = torch.ops.aten
    if q.device.type == 'cpu':
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)
        return out, lse, ()
    if q.dtype in (torch.float16, torch.bfloat16):  # CUDA FlashAttention-2
        out, lse, *state, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal)
        return out, lse, tuple(state)  # cum_seq_q, cum_seq_k, max_q, max_k, philox seed, offset
    # CUDA float32: the memory-efficient kernel; its lse is padded along T (to a multiple of 32)
    out, lse_padded, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, is_causal)
    return out, lse_padded[..., :q.size(2)], (lse_padded, seed, offset)


def _flash_backward(grad_out, q, k, v, out, lse, is_causal, state):
    """(dq, dk, dv) from the kernel's own backward, for the `out` and `lse` given."""
    aten = torch.ops.aten
    if q.device.type == 'cpu':
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, is_causal)
    if len(state) == 6:
        cum_q, cum_k, max_q, max_k, seed, offset = state
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, is_causal, seed, offset)
    lse_padded, seed, offset = state
    lse_padded = lse_padded.clone()
    lse_padded[..., :q.size(2)] = lse
    return aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse_padded, seed, offset, 0.0, [True, True, True, False],
        is_causal)[:3]


class SinkAttention(torch.autograd.Function):
    """Eq. 3 exactly, without a T x T matrix. The sink adds e^s to every denominator, so with lse_i
    from a flash kernel: out'_i = out_i * exp(lse_i - lse'_i), lse'_i = logaddexp(lse_i, s).
    Backward: flash backward recomputes P = exp(S - lse') and uses rowsum(dO * O'), so handing it
    (O', lse') is exact; with p_sink,i = exp(s - lse'_i), ds = -sum_i p_sink,i rowsum(dO_i O'_i)."""

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
