"""The kernels of model.py's attention (arXiv 2602.23057, Sections 2.2-2.3): softmax_attention
(Eq. 1 on PyTorch's fused SDPA), sink_attention (Eq. 3 in O(T) memory with exact gradients), the
explicit T x T forms every variant's reference starts from, and KVCache. Each kernel takes `causal`
and an optional `mask` (B, 1, T, T_k), which say which keys each query sees: with causal=True, the
keys j <= i; a bool mask replaces that rule; with neither, every key, as one decoded token does."""
import math

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def at_least_fp32(t):
    """Upcast half precision to float32 for norms, exponentials and sums; float64 stays float64."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def needs_repeated_kv(device_type, dtype):
    """Whether the fused kernel cannot read grouped K and V: CUDA float32's memory-efficient kernel
    cannot (torch <= 2.13; SDPA would fall back to a T x T matrix). Flash, cuDNN and CPU can."""
    return device_type == 'cuda' and dtype not in (torch.float16, torch.bfloat16)


def kv_for_kernel(q, k, v):
    """k and v (B, H_kv, T, D) in the layout the fused kernel for q (B, H, T, D) reads."""
    G = q.size(1) // k.size(1)
    if G > 1 and needs_repeated_kv(q.device.type, q.dtype):
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return k, v


def softmax_attention(q, k, v, causal=True, mask=None):
    """Eq. 1 on PyTorch's fused SDPA kernels; q is (B, H, T, D), k and v (B, H_kv, T_k, D)."""
    k, v = kv_for_kernel(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          is_causal=causal and mask is None,
                                          enable_gqa=k.size(1) != q.size(1))


def sink_attention(q, k, v, sinks, causal=True, mask=None):
    """Eq. 3: softmax attention with the learnable logit sinks[h] in every denominator of head h,
    in O(T) memory on CPU and CUDA without a mask (SinkAttention), else as the explicit matrix."""
    if q.device.type in ('cpu', 'cuda') and mask is None:
        return SinkAttention.apply(q, *kv_for_kernel(q, k, v), sinks, causal)
    return sink_attention_explicit(q, k, v, sinks, causal, mask)


class KVCache:
    """A layer's keys and values across calls (decoding, scoring continuations) and a variant's
    running sums (Variant.cache). Each row of a right-padded batch goes on after its real tokens."""

    def __init__(self, max_len):
        self.max_len = max_len
        self.length = 0  # the slots written so far, padding included
        self.k = self.v = None  # (B, H_kv, max_len, D), allocated by the first update
        self.real = None  # (B, max_len) bool: whether a written slot holds a real token
        self.padded = False  # whether any written slot is padding
        self.sums = {}  # name -> (B, H_kv, 1, D), a float32 sum over each row's real tokens

    def positions(self, T, seq_lens=None, device=None):
        """(positions, the tokens the longest row then reaches) of T new tokens, seq_lens (B,) of
        them real if given. Positions are (T,) until padding is cached, then (B, T), row by row."""
        new = torch.arange(T, device=device)
        if not self.padded:
            return new + self.length, self.length + T
        seen = self.real[:, :self.length].sum(1, keepdim=True)  # (B, 1): each row's real tokens
        return seen + new, int((seen[:, 0] + (T if seq_lens is None else seq_lens)).max())

    def update(self, k, v, seq_lens=None):
        """Append this call's k and v (B, H_kv, T, D), whose rows hold seq_lens (B,) real tokens
        if given. Returns every cached key and value, and (causal, mask) for the new queries."""
        B, _, T, _ = k.shape
        if self.k is None:  # allocated now, in the dtype and on the device the layer produces
            shape = (B, k.size(1), self.max_len, k.size(3))
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
            self.real = torch.zeros(B, self.max_len, dtype=torch.bool, device=k.device)
        if self.length + T > self.max_len:
            raise ValueError(f"a KV cache of {self.max_len} tokens holds {self.length}: no room "
                             f"for {T} more")
        start, self.length = self.length, self.length + T
        self.k[:, :, start:self.length], self.v[:, :, start:self.length] = k, v
        self.real[:, start:self.length] = True
        if seq_lens is not None:  # a row's padding follows its real tokens
            self.real[:, start:self.length] = torch.arange(T, device=k.device) < seq_lens[:, None]
            self.padded = self.padded or bool((seq_lens < T).any())
        k, v = self.k[:, :, :self.length], self.v[:, :, :self.length]
        if start == 0:  # the first call sees only its own tokens, causally
            return k, v, True, None
        if T == 1 and not self.padded:  # one decoded token sees every cached key
            return k, v, False, None
        # a query sees its row's real cached tokens, then this call's causally (padding comes last)
        tril = torch.ones(T, T, dtype=torch.bool, device=k.device).tril()
        return k, v, False, torch.cat([self.real[:, None, None, :start].expand(B, 1, T, start),
                                       tril.expand(B, 1, T, T)], dim=-1)

    def running_sum(self, name, values, seq_lens=None):
        """Running sums of values (B, H_kv, T, D) along T, continued from the cache's sum `name`
        over each row's earlier real tokens; padding adds nothing."""
        if seq_lens is not None:
            padding = torch.arange(values.size(2), device=values.device) >= seq_lens[:, None]
            values = values.masked_fill(padding[:, None, :, None], 0.0)
        sums = values.cumsum(dim=2) + self.sums.get(name, 0.0)
        self.sums[name] = sums[:, :, -1:]
        return sums

    def select(self, rows):
        """A cache of the given rows, (R,) indices that may repeat: one context per continuation."""
        cache = KVCache(self.max_len)
        cache.length, cache.padded = self.length, self.padded
        cache.k, cache.v, cache.real = self.k[rows], self.v[rows], self.real[rows]
        cache.sums = {name: s[rows] for name, s in self.sums.items()}
        return cache


# The explicit T x T forms: the slow path
def attention_scores(q, k, causal=True, mask=None):
    """QK^T / sqrt(d) as an explicit (B, H, T_q, T_k) matrix, at least float32, with the keys a
    query does not see at -inf. Every explicit form starts here."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = at_least_fp32(q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal and mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    return scores if mask is None else scores.masked_fill(~mask, float('-inf'))


def sink_weights(scores, sinks):
    """Eq. 3 as a matrix: a softmax over the masked scores and one sink logit per head, whose column
    is then dropped. Each row sums to less than 1; the rest is the sink's own mass."""
    sink_column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]


def sink_attention_explicit(q, k, v, sinks, causal=True, mask=None):
    """Eq. 3 through the explicit T x T matrix: for masks, and devices with no LSE kernel."""
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)  # one V head per query head
    return sink_weights(attention_scores(q, k, causal, mask), sinks).to(v.dtype) @ v


# The sink in O(T) memory, from the log-sum-exp (LSE) that three fused kernels return (aten ops)
def bthd(t):
    """t (B, H, T, D) stored in the (B, T, H, D) layout of the model's q, k and v (no copy if it
    is). CUDA's memory-efficient backward needs `out` in it, unchecked; grad_out arrives in it."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _flash_forward(q, k, v, causal):
    """(out, lse, state), where lse_i = logsumexp_j(q_i.k_j / sqrt(d)) over the keys query i sees
    and `state` is what the kernel's backward needs besides q, k, v, out and lse."""
    if q.device.type == 'cpu':
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return out, lse, ()
    if q.dtype in (torch.float16, torch.bfloat16):  # CUDA FlashAttention-2
        out, lse, *state, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return out, lse, tuple(state)  # cum_seq_q, cum_seq_k, max_q, max_k, philox seed, offset
    # CUDA float32 runs the memory-efficient kernel, whose lse is padded along T to a multiple of 32
    out, lse_padded, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal)
    return out, lse_padded[..., :q.size(2)], (lse_padded, seed, offset)


def _flash_backward(grad_out, q, k, v, out, lse, causal, state):
    """(dq, dk, dv) from the kernel's own backward, for the given `out` and `lse`."""
    if q.device.type == 'cpu':
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal)
    if len(state) == 6:  # FlashAttention-2: cum_seq_q, cum_seq_k, max_q, max_k, seed, offset
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, *state[:4], 0.0, causal, *state[4:])
    lse_padded = state[0].clone()  # this lse, then the kernel's padding
    lse_padded[..., :q.size(2)] = lse
    return aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse_padded, *state[1:], 0.0, [True, True, True, False],
        causal)[:3]


class SinkAttention(torch.autograd.Function):
    """Eq. 3 exactly, without a T x T matrix: out * exp(lse - lse') with lse' = logaddexp(lse, s),
    and its gradients (docs/implementation.md, "Sink with exact gradients in O(T)")."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, causal):
        out, lse, ctx.state = _flash_forward(q, k, v, causal)
        lse = at_least_fp32(lse)
        lse_sink = torch.logaddexp(lse, sinks.to(lse.dtype).view(1, -1, 1))
        out = bthd((at_least_fp32(out) * torch.exp(lse - lse_sink).unsqueeze(-1)).to(q.dtype))
        ctx.save_for_backward(q, k, v, sinks, out, lse_sink)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, sinks, out, lse_sink = ctx.saved_tensors
        grad_out = bthd(grad_out)
        dq, dk, dv = _flash_backward(grad_out, q, k, v, out, lse_sink, ctx.causal, ctx.state)
        p_sink = torch.exp(sinks.to(lse_sink.dtype).view(1, -1, 1) - lse_sink)
        dsinks = -(p_sink * (at_least_fp32(grad_out) * at_least_fp32(out)).sum(-1)).sum(dim=(0, 2))
        return dq, dk, dv, dsinks.to(sinks.dtype), None
