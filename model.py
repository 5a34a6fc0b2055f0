"""The network of "Affine-Scaled Attention: Towards Flexible and Stable Transformer Attention" (Bae
et al., 2026, https://arxiv.org/abs/2602.23057), whose equation numbers the comments use: a
Llama-style decoder, with Hugging Face's Llama and Qwen2 parameter names, whose attention
(ModelConfig.attention) is softmax (Eq. 1), sink (Eq. 3), affine (Eq. 6-9) or softmax1 (Eq. 2),
each with or without an output gate (Eq. 4-5, or Qiu et al.'s per head). Each has an O(T) forward
on a fused kernel and an explicit T x T form that the tests hold it to."""
import math
from dataclasses import dataclass, fields
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

try:  # transformers loads an export (export_hf.py) as a package and checks imports outside a try
    from .attention_kernels import (KVCache, at_least_fp32, attention_scores, sink_attention,
                                    sink_weights, softmax_attention)
except ImportError:  # this repository: model.py is a top-level module
    from attention_kernels import (KVCache, at_least_fp32, attention_scores, sink_attention,
                                   sink_weights, softmax_attention)

AFFINE_ACTS = ('linear_clip', 'sigmoid')
AFFINE_BIAS_NORMS = ('seq_len', 'visible')
GATES = ('none', 'elementwise', 'headwise')  # no gate, Eq. 4-5's gate, or Qiu et al.'s per head
IGNORE_INDEX = -100  # the loss leaves out targets with this value (PyTorch's default)


@dataclass
class ModelConfig:
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4  # below n_head, n_head // n_kv_head query heads share each key head
    n_embd: int = 128
    intermediate_size: int = 344  # SwiGLU hidden width
    vocab_size: int = 512
    block_size: int = 256  # the longest sequence the model reads (generate's window)
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # Hugging Face's Llama-3 dict {'rope_type': 'llama3', ...}
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False  # Qwen1.5 and Qwen2 put biases on q, k and v (not on o)
    tie_embeddings: bool = False
    init_std: float = 0.02  # Hugging Face's initializer_range
    attention: str = 'softmax'  # one of ATTENTIONS: a key of VARIANTS or of GATED_NAMES
    gate: str = 'none'  # one of GATES: the output gate, which goes on any variant
    affine_act: str = 'linear_clip'  # phi of Eq. 7: the paper's Eq. 11, or sigmoid (Eq. 10)
    affine_momentum: float = 0.9  # rho of Eq. 9
    # N of Eq. 8. 'seq_len' is the paper's: the call's key length (each row's own with right
    # padding). 'visible' counts the keys query i sees, N_i = i + 1, so each row sums to alpha_ma.
    affine_bias_norm: str = 'seq_len'

    def __post_init__(self):
        if isinstance(self.gate, bool):  # a bool in a config or checkpoint: True is Eq. 4-5's gate
            self.gate = 'elementwise' if self.gate else 'none'
        for name, choices in [('attention', ATTENTIONS), ('affine_act', AFFINE_ACTS),
                              ('affine_bias_norm', AFFINE_BIAS_NORMS), ('gate', GATES)]:
            if (value := getattr(self, name)) not in choices:
                raise ValueError(f"ModelConfig.{name}={value!r}; valid values: "
                                 + ', '.join(choices))
        if self.gate not in ('none', self.gate_kind):  # a GATED_NAMES name fixes its own gate
            raise ValueError(f"ModelConfig.attention={self.attention!r} has the {self.gate_kind} "
                             f"gate; gate={self.gate!r} contradicts it: leave gate 'none'")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head or self.head_dim % 2:
            raise ValueError("need n_embd % n_head == 0, n_head % n_kv_head == 0 and an even "
                             f"head_dim; got n_embd={self.n_embd}, n_head={self.n_head}, "
                             f"n_kv_head={self.n_kv_head}")
        if not 0.0 <= (rho := self.affine_momentum) <= 1.0:
            raise ValueError(f"ModelConfig.affine_momentum={rho} must be in [0, 1]")
        if self.rope_scaling is not None:
            need = {*LLAMA3_ROPE, 'factor'}  # the keys of Llama 3's dict
            if self.rope_scaling.get('rope_type') != 'llama3' or not need <= set(self.rope_scaling):
                raise ValueError("rope_scaling must be None or Llama-3's dict with keys "
                                 f"{sorted(need)} and rope_type='llama3'; got {self.rope_scaling}")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def gate_kind(self):
        return GATED_NAMES[self.attention].gate if self.attention in GATED_NAMES else self.gate

    @property
    def is_gated(self):
        return self.gate_kind != 'none'

    @property
    def variant_name(self):
        return GATED_NAMES[self.attention].base if self.attention in GATED_NAMES else self.attention

    @property
    def variant(self):
        return VARIANTS[self.variant_name]

    @property
    def outputs_depend_on_length(self):
        """Whether a position's output changes with later tokens, so that a KV cache is inexact."""
        return self.variant.depends_on_length(self)


FIELD_NAMES = tuple(f.name for f in fields(ModelConfig))

# The shapes the paper's models and the one-GPU tier copy, from each one's config.json on the hub
LLAMA3_ROPE = dict(rope_type='llama3', low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
LLAMA3 = dict(rope_theta=500000.0, rms_norm_eps=1e-5, qkv_bias=False, vocab_size=128256,
              tie_embeddings=False, block_size=2048)
LLAMA32 = dict(LLAMA3, intermediate_size=8192, tie_embeddings=True,
               rope_scaling=dict(LLAMA3_ROPE, factor=32.0))  # Llama 3.2's 1B and 3B
QWEN = dict(rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6, qkv_bias=True, n_layer=24,
            n_head=16, n_kv_head=16, block_size=2048, vocab_size=151936)  # padded from 151,646
SMOLLM2 = dict(vocab_size=49152, rope_theta=100000.0, rope_scaling=None, rms_norm_eps=1e-5,
               qkv_bias=False, tie_embeddings=True, block_size=2048)
MODEL_SHAPES = {
    'qwen1.5-0.5b': dict(QWEN, n_embd=1024, intermediate_size=2816, tie_embeddings=True),
    'qwen1.5-1.8b': dict(QWEN, n_embd=2048, intermediate_size=5504, tie_embeddings=False),
    'llama3.2-1b': dict(LLAMA32, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048),
    'llama3.2-3b': dict(LLAMA32, n_layer=28, n_head=24, n_kv_head=8, n_embd=3072),
    'llama3.1-8b': dict(LLAMA3, n_layer=32, n_head=32, n_kv_head=8, n_embd=4096,
                        intermediate_size=14336, rope_scaling=dict(LLAMA3_ROPE, factor=8.0)),
    'smollm2-135m': dict(SMOLLM2, n_layer=30, n_head=9, n_kv_head=3, n_embd=576,
                         intermediate_size=1536),
    'smollm2-360m': dict(SMOLLM2, n_layer=32, n_head=15, n_kv_head=5, n_embd=960,
                         intermediate_size=2560),
    # the CPU shape of tiny_cpu.py and the quick start, published nowhere (257 byte ids, 320 rows)
    'tiny': dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, intermediate_size=384,
                 vocab_size=320, block_size=256, rope_theta=10000.0, tie_embeddings=True),
}


# Building blocks shared by every variant: RMSNorm, RoPE, SwiGLU --------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = at_least_fp32(x)  # as LlamaRMSNorm: normalise in float32, then scale in x's dtype
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(config, positions):
    """The cos and sin tables (T, head_dim), or (B, T, head_dim), of absolute positions, in HF's
    rotate-half layout: computed by each forward, so that a model built on meta needs no re-init."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, device=positions.device).float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    if config.rope_scaling is not None:  # Llama 3.1's frequency scaling (rope_type "llama3")
        old_ctx, low, high, factor = (config.rope_scaling[key] for key in (
            'original_max_position_embeddings', 'low_freq_factor', 'high_freq_factor', 'factor'))
        wavelen = 2 * math.pi / inv_freq
        # smooth is 0 for long waves, which are slowed by factor, and 1 for short ones, kept
        smooth = ((old_ctx / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """Rotate x (B, H, T, D) by cos and sin, (T, D), or (B, T, D) where rows have their own
    positions. Channel i pairs with i + D/2 (rotate-half), as in Hugging Face's checkpoints."""
    cos, sin = cos.unsqueeze(-3).to(x.dtype), sin.unsqueeze(-3).to(x.dtype)  # a dim for the heads
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# The attention variants, each written twice as functions of the layer `attn` ------------------
# forward(attn, q, k, v, causal, mask, **call) -> y (B, H, T, D) is the O(T) path over every key
# the call sees, cached ones included; call holds alpha, v_new, positions, seq_lens and cache.
# weights(attn, scores, **call) -> A (B, H, T, T), at least float32, is its explicit form: A V = y.

def softmax_forward(attn, q, k, v, causal, mask, **call):
    return softmax_attention(q, k, v, causal, mask)  # Eq. 1


def softmax_weights(attn, scores, **call):
    return torch.softmax(scores, dim=-1)


def sink_tensors(attn, config):
    attn.sinks = nn.Parameter(torch.zeros(config.n_head))  # s_h of Eq. 3, one logit per head


def sink_forward(attn, q, k, v, causal, mask, **call):  # Eq. 3: e^{s_h} joins every denominator
    return sink_attention(q, k, v, attn.sinks, causal, mask)


def sink_weights_of(attn, scores, **call):
    return sink_weights(scores, attn.sinks)  # without the sink's own mass, so rows sum to below 1


def affine_tensors(attn, config):
    attn.alpha_proj = nn.Linear(config.n_embd, config.n_head, bias=False)  # W_alpha of Eq. 7
    attn.register_buffer('alpha_ma', torch.zeros(config.n_head))  # Eq. 9 with alpha_ma,0 = 0
    attn.register_buffer('alpha_sum', torch.zeros(config.n_head), persistent=False)
    attn.register_buffer('alpha_count', torch.zeros(()), persistent=False)


def affine_alpha(attn, x):
    """Eq. 7: alpha = phi(W_alpha X), (B, T, H) in at least float32, phi being Eq. 11 or Eq. 10."""
    a = at_least_fp32(attn.alpha_proj(x))
    return (0.1 * a + 0.5).clamp(0, 1) if attn.config.affine_act == 'linear_clip' else a.sigmoid()


def bias_norm(config, positions, seq_lens, n_keys):
    """N of Eq. 8, broadcastable to (B, H, T, 1): the keys query i sees ('visible'), else each
    right-padded row's real length, or the call's key length, which counts every cached key too."""
    if config.affine_bias_norm == 'visible':  # positions (T,) or (B, T)
        return (positions + 1)[..., None, :, None]
    return n_keys if seq_lens is None else seq_lens.view(-1, 1, 1, 1)


def affine_scaled(y, alpha, alpha_ma, v_mean):
    """Eq. 6 and 8 without the T x T matrix: beta, constant along a row, goes on the keys j <= i, so
    row i is alpha_i y_i + (alpha_ma - alpha_i) v_mean_i (docs/implementation.md, "Affine in O(T)").
    y (B, H, T, D) is softmax(QK^T / sqrt(d)) V; alpha (B, T, H) and v_mean (B, H_kv, T, D) =
    (sum_{j<=i} V_j) / N are float32, each v_mean head shared by G query heads."""
    B, H, T, D = y.shape
    H_kv, G = v_mean.size(1), H // v_mean.size(1)
    alpha = alpha.transpose(1, 2).unsqueeze(-1).view(B, H_kv, G, T, 1)
    beta_scale = alpha_ma.view(1, H_kv, G, 1, 1) - alpha
    out = alpha * y.view(B, H_kv, G, T, D) + beta_scale * v_mean.unsqueeze(2)
    return out.view(B, H, T, D).to(y.dtype)


def affine_forward(attn, q, k, v, causal, mask, alpha, v_new, positions, seq_lens, cache, **call):
    y = softmax_attention(q, k, v, causal, mask)
    v_new = at_least_fp32(v_new)
    # sum_{j<=i} V_j over the keys query i sees: this call's, after the cache's
    v_sums = v_new.cumsum(dim=2) if cache is None else cache.running_sum('v_sum', v_new, seq_lens)
    return affine_scaled(y, alpha, attn.alpha_ma,
                         v_sums / bias_norm(attn.config, positions, seq_lens, k.size(2)))


def affine_weights(attn, scores, alpha, positions, seq_lens, **call):
    visible = scores > float('-inf')  # the causal keys, less any that the analyses' knockout hides
    seen = visible[0, 0].sum(-1)  # the keys each query sees, alike in every row; N counts them
    alpha = alpha.transpose(1, 2).unsqueeze(-1)  # (B, H, T, 1)
    n = bias_norm(attn.config, seen - 1, seq_lens, int(seen.max()))
    beta = (attn.alpha_ma.view(1, -1, 1, 1) - alpha) / n
    return alpha * torch.softmax(scores, dim=-1) + beta * visible  # Eq. 6-8: beta on visible keys


def accumulate_alpha(attn, alpha, positions, seq_lens):
    """Add alpha's sum per head and its token count, padding left out, to update_alpha_ma's sums."""
    alpha = alpha.detach()
    if seq_lens is None:
        attn.alpha_sum += alpha.sum(dim=(0, 1))
        attn.alpha_count += alpha.size(0) * alpha.size(1)
    else:
        real = (positions[None, :] < seq_lens[:, None]).unsqueeze(-1)  # (B, T, 1)
        attn.alpha_sum += (alpha * real).sum(dim=(0, 1))
        attn.alpha_count += real.sum()


def softmax1_forward(attn, q, k, v, causal, mask, **call):  # Eq. 2: the sink's logit fixed at 0
    return sink_attention(q, k, v, q.new_zeros(attn.config.n_head), causal, mask)


def softmax1_weights(attn, scores, **call):  # rows sum to less than 1: the 1's share
    return sink_weights(scores, scores.new_zeros(attn.config.n_head))


def init_variant_tensors(attn, std):
    """Draws parameters from normal(0, init_std), as gpt-oss does its sinks, and zeroes buffers."""
    for p in attn._parameters.values():
        nn.init.normal_(p, mean=0.0, std=std)
    for b in attn._buffers.values():
        b.zero_()


@dataclass(frozen=True)
class Variant:
    """What the network needs to compute one attention variant; the tools keep their own tables,
    keyed by its name (docs/implementation.md, "Adding your own attention")."""
    forward: Callable  # the O(T) path (above)
    weights: Callable  # the explicit T x T form (above), which the tests and analyses read
    tensors: Optional[Callable] = None  # (attn, config) registers what it adds to q/k/v/o_proj
    init: Callable = init_variant_tensors  # (attn, init_std), also after to_empty
    alpha: Optional[Callable] = None  # (attn, x) -> (B, T, H): Eq. 7's scale, averaged by Eq. 9
    fp32: tuple = ()  # buffers kept float32 always; unsaved ones are per-rank sums, never synced
    cache: tuple = ()  # the running sums its KVCache keeps beyond K and V (KVCache.sums' names)
    depends_on_length: Callable = lambda config: False  # ModelConfig.outputs_depend_on_length


VARIANTS = {
    'softmax': Variant(softmax_forward, softmax_weights),
    'sink': Variant(sink_forward, sink_weights_of, sink_tensors),
    'affine': Variant(affine_forward, affine_weights, affine_tensors, alpha=affine_alpha,
                      fp32=('alpha_ma', 'alpha_sum', 'alpha_count'), cache=('v_sum',),
                      depends_on_length=lambda config: config.affine_bias_norm == 'seq_len'),
    'softmax1': Variant(softmax1_forward, softmax1_weights),
}
# A GATED_NAMES name is a variant with a gate; ATTENTIONS holds every name, the paper's five first
Gated = NamedTuple('Gated', [('base', str), ('gate', str)])  # a key of VARIANTS, one of GATES
GATED_NAMES = {'gated': Gated('softmax', 'elementwise'),
               'affine_gated': Gated('affine', 'elementwise'),
               'headwise_gated': Gated('softmax', 'headwise')}
PAPER_VARIANTS = ('softmax', 'sink', 'gated', 'affine', 'affine_gated')
ATTENTIONS = PAPER_VARIANTS + tuple(n for n in [*VARIANTS, *GATED_NAMES] if n not in PAPER_VARIANTS)
BASELINE = 'softmax'  # the paper's baseline


def is_variant_tensor(key):
    """Whether a parameter or state-dict key is one that the variant or gate adds (ΔParams)."""
    parts = key.split('.')
    return 'self_attn' in parts and parts[parts.index('self_attn') + 1] not in (
        'q_proj', 'k_proj', 'v_proj', 'o_proj')


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        H, H_kv, D, C = config.n_head, config.n_kv_head, config.head_dim, config.n_embd
        self.q_proj = nn.Linear(C, H * D, bias=config.qkv_bias)
        self.k_proj = nn.Linear(C, H_kv * D, bias=config.qkv_bias)
        self.v_proj = nn.Linear(C, H_kv * D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.explicit = False  # whether to attend through the explicit T x T weights (slow)
        self.hidden_keys = None  # (T, T) keys the explicit path hides beyond causal (a knockout)
        if config.is_gated:  # W_g of Eq. 5: one gate per output channel, or per head (Qiu et al.)
            self.g_proj = nn.Linear(C, H if config.gate_kind == 'headwise' else H * D, bias=False)
        if config.variant.tensors:
            config.variant.tensors(self, config)

    def forward(self, x, cos, sin, positions, seq_lens=None, cache=None, count_alpha=True):
        """x (B, T, C) is the normed X that feeds q, k, v, alpha and the gate. count_alpha=False
        leaves alpha_ma's sums to the caller (Block.forward, under activation checkpointing)."""
        B, T, _ = x.shape
        variant = self.config.variant
        q, k, v_new = self.project(x, cos, sin)
        k, v, causal, mask = ((k, v_new, True, None) if cache is None
                              else cache.update(k, v_new, seq_lens))
        alpha = None
        if variant.alpha:
            alpha = variant.alpha(self, x)  # Eq. 7
            if self.training and count_alpha:
                accumulate_alpha(self, alpha, positions, seq_lens)  # for alpha_ma's update, Eq. 9

        if self.explicit:  # the slow reference: the variant's explicit T x T weights
            if cache is not None:
                raise ValueError("Attention.explicit computes whole sequences: no KV cache")
            weights = self.weights(x, cos, sin, positions, seq_lens, self.hidden_keys)
            y = weights.to(v.dtype) @ v.repeat_interleave(q.size(1) // v.size(1), 1)
        else:
            y = variant.forward(self, q, k, v, causal, mask, alpha=alpha, v_new=v_new,
                                positions=positions, seq_lens=seq_lens, cache=cache)

        y = y.transpose(1, 2).reshape(B, T, -1)
        # The gate scales Y by sigmoid(X W_g), per channel (Eq. 4-5) or per head (Qiu et al. 2025)
        if self.config.is_gated:
            g = torch.sigmoid(self.g_proj(x))  # (B, T, H * D), or (B, T, H)
            y = (y.view(B, T, g.size(-1), -1) * g[..., None]).flatten(2)
        return self.o_proj(y)

    def project(self, x, cos, sin):
        """q (B, H, T, D), and k and v (B, H_kv, T, D), of the normed x (B, T, C); RoPE on q, k."""
        B, T, _ = x.shape
        # the head counts as numbers, not -1: a compiled layer keeps them static (SDPA's enable_gqa)
        heads = self.config.n_head, self.config.n_kv_head, self.config.n_kv_head
        q, k, v = (proj(x).view(B, T, h, self.config.head_dim).transpose(1, 2)
                   for proj, h in zip((self.q_proj, self.k_proj, self.v_proj), heads))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def weights(self, x, cos, sin, positions, seq_lens=None, hidden=None):
        """The explicit weights (B, H, T, T), at least float32, that times V give the O(T) forward's
        y. hidden, a (T, T) bool, hides keys beyond causal (a knockout); alpha_ma's sums stay."""
        variant = self.config.variant
        q, k, _ = self.project(x, cos, sin)
        alpha = variant.alpha(self, x) if variant.alpha else None
        scores = attention_scores(q, k)
        if hidden is not None:
            scores = scores.masked_fill(hidden, -math.inf)
        return variant.weights(self, scores, alpha=alpha, positions=positions, seq_lens=seq_lens)

    def _apply(self, fn, recurse=True):
        """nn.Module's to, half, cuda and to_empty end here. Variant.fp32's buffers stay float32:
        alpha_ma ~ 0.5 in bf16 is off by up to 2e-3, and alpha_count would stop counting at 256."""
        before = {name: t for name, t in self._buffers.items() if name in self.config.variant.fp32}
        super()._apply(fn, recurse)
        for name, t in before.items():
            if self._buffers[name].dtype in (torch.float16, torch.bfloat16):
                self._buffers[name] = t.to(device=self._buffers[name].device, dtype=torch.float32)
        return self


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.activation_checkpointing = False  # backward recomputes the block: no activations kept

    def forward(self, x, cos, sin, positions, seq_lens=None, cache=None):
        if not (self.activation_checkpointing and torch.is_grad_enabled()):
            return self.compute(x, cos, sin, positions, seq_lens, cache)
        # alpha is counted here, outside the recomputation, which would count it twice;
        # checkpointing inside forward keeps FSDP's hooks on this module out of it
        attn = self.self_attn
        if attn.training and attn.config.variant.alpha:
            with torch.no_grad():
                accumulate_alpha(attn, attn.config.variant.alpha(attn, self.input_layernorm(x)),
                                 positions, seq_lens)
        return checkpoint(self.compute, x, cos, sin, positions, seq_lens, count_alpha=False,
                          use_reentrant=False)

    def compute(self, x, cos, sin, positions, seq_lens=None, cache=None, count_alpha=True):
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, positions, seq_lens, cache, count_alpha)
        return x + self.mlp(self.post_attention_layernorm(x))


# The model ------------------------------------------------------------------------------------

class GPT(nn.Module):
    length_note = ''  # why block_size is what it is, when something other than training set it

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.n_embd),
            layers=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            norm=RMSNorm(config.n_embd, config.rms_norm_eps)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    @classmethod
    def from_pretrained(cls, path, attention='softmax', dtype=torch.float32, device='cpu'):
        """A GPT from a Hugging Face Llama, Mistral or Qwen2 directory, an export or ckpt.pt."""
        from lmkit.pretrained import load_model  # imported when called, so model.py stands alone
        return load_model(path, attention, dtype, device, cls=cls)

    def _init_weights(self, module):
        """Hugging Face Llama's init, also after to_empty(); a variant's tensors by Variant.init."""
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, 'bias', None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, Attention):
            module.config.variant.init(module, std)

    def forward(self, idx, targets=None, *, seq_lens=None, kv_caches=None, return_hidden=False):
        """(logits (B, T, vocab), mean cross-entropy or None) of the token ids idx (B, T), or with
        return_hidden=True the final normed hidden states (for fused losses) and None. seq_lens (B,)
        holds right-padded rows' real lengths; idx goes on after what kv_caches (per layer) hold."""
        if return_hidden and targets is not None:
            raise ValueError("return_hidden=True returns hidden states, not logits: compute the "
                             "loss yourself")
        positions = self.token_positions(idx, seq_lens, kv_caches)
        cos, sin = rope_cos_sin(self.config, positions)
        x = self.model.embed_tokens(idx)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, positions, seq_lens, kv_caches[i] if kv_caches else None)
        x = self.model.norm(x)
        if return_hidden:
            return x, None
        logits = self.lm_head(x)
        loss = None if targets is None else F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    def token_positions(self, idx, seq_lens=None, kv_caches=None):
        """idx's token positions after what kv_caches hold, with seq_lens and block_size checked."""
        B, T = idx.shape
        if seq_lens is not None and (seq_lens.shape != (B,) or seq_lens.min() < 1
                                     or seq_lens.max() > T):
            raise ValueError(f"seq_lens must have shape ({B},) with values in [1, {T}], got "
                             f"{seq_lens.tolist()}")
        positions, end = (kv_caches[0].positions(T, seq_lens, idx.device) if kv_caches
                          else (torch.arange(T, device=idx.device), T))
        if end > self.config.block_size:
            raise ValueError(f"sequence of {end} tokens is longer than "
                             f"block_size={self.config.block_size}{self.length_note}")
        return positions

    @torch.no_grad()
    def update_alpha_ma(self, discard=False):
        """Eq. 9, once per optimizer step: alpha_ma <- rho alpha_ma + (1 - rho) E[alpha], E over the
        global batch. Step t's forward reads alpha_ma,t-1 (our reading: the paper is silent).
        discard=True only clears the sums (a skipped step). Returns E[alpha] per layer, or []."""
        layers = [m.self_attn for m in self.model.layers if m.self_attn.config.variant.alpha]
        stats = [torch.cat([m.alpha_sum, m.alpha_count.view(1)]) for m in layers]
        for m in layers:
            m.alpha_sum.zero_()
            m.alpha_count.zero_()
        if discard or not layers:
            return []
        stats = torch.stack(stats)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        if stats[0, -1].item() == 0:
            return []
        means = stats[:, :-1] / stats[:, -1:]
        rho = self.config.affine_momentum
        for m, mean in zip(layers, means):
            m.alpha_ma.mul_(rho).add_((1 - rho) * mean)
        return list(means)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=None):
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy, and a
        context keeps its last block_size tokens. Where outputs depend on the call's length, each
        step recomputes the window, unless use_cache=True forces the cache (an approximation)."""
        if temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError("need temperature >= 0 and top_k >= 1 or None, got "
                             f"{temperature}, {top_k}")
        use_cache = not self.config.outputs_depend_on_length if use_cache is None else use_cache
        window, caches = self.config.block_size, None
        cache_len = min(window, idx.size(1) + max_new_tokens)  # the most this call can fill
        for _ in range(max_new_tokens):
            if use_cache and caches is not None and caches[0].length < cache_len:
                logits, _ = self(idx[:, -1:], kv_caches=caches)  # decode: the one new token
            else:  # recompute, or (re)fill the cache
                caches = [KVCache(cache_len) for _ in self.model.layers] if use_cache else None
                logits, _ = self(idx[:, -window:], kv_caches=caches)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float('-inf'))
                next_token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_token), dim=1)
        return idx

    def get_num_params(self, variant_only=False):
        """The parameter count, tied embeddings once, or with variant_only=True the ΔParams only."""
        return sum(p.numel() for name, p in self.named_parameters()
                   if not variant_only or is_variant_tensor(name))
