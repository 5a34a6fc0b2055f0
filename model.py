"""
The network of "Affine-Scaled Attention: Towards Flexible and Stable Transformer Attention" (Bae et
al., 2026, https://arxiv.org/abs/2602.23057; equation numbers are the paper's): one Llama-style
decoder whose attention is one flag, ModelConfig.attention. Its variants, each one entry of VARIANTS
(the only place that names them): softmax (Eq. 1), sink (Eq. 3), affine (Eq. 6-9) and softmax1
(Eq. 2); Eq. 4-5's output gate, or Qiu et al.'s per head, goes on any (gated, affine_gated,
headwise_gated). Each has an O(T) forward on a fused kernel (attention_kernels.py) and an explicit
T x T form, the tests' reference. Parameter names are HF Llama/Qwen2's (a softmax state_dict is an
HF checkpoint); the README's variant table has the equations, docs/implementation.md their build.
"""
import math
from dataclasses import dataclass, fields
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# transformers imports an exported model directory (export_hf.py) as a package: relative imports
# only, and absolute imports of modules not installed are refused outside a try
try:
    from .attention_kernels import (KVCache, at_least_fp32, attention_scores, sink_attention,
                                    sink_weights, softmax_attention)
except ImportError:  # this repository: model.py is a top-level module
    from attention_kernels import (KVCache, at_least_fp32, attention_scores, sink_attention,
                                   sink_weights, softmax_attention)

AFFINE_ACTS = ('linear_clip', 'sigmoid')
AFFINE_BIAS_NORMS = ('seq_len', 'visible')
GATES = ('none', 'elementwise', 'headwise')  # ModelConfig.gate: none, Eq. 4-5's, Qiu et al.'s
IGNORE_INDEX = -100  # targets with this value are left out of the loss (PyTorch's default)


@dataclass
class ModelConfig:
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4  # < n_head: grouped-query attention (n_head // n_kv_head share a key)
    n_embd: int = 128
    intermediate_size: int = 344  # SwiGLU hidden width
    vocab_size: int = 512
    block_size: int = 256  # the longest sequence (KV cache size, generate's window)
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # HF's Llama-3 dict: {'rope_type': 'llama3', ...}
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False  # Qwen1.5/Qwen2 have biases on q/k/v (not on o)
    tie_embeddings: bool = False
    init_std: float = 0.02  # HF's initializer_range
    attention: str = 'softmax'  # one of ATTENTIONS: a VARIANTS entry, or a name of GATED_NAMES
    gate: str = 'none'  # one of GATES: the output gate, on any variant (Attention.forward)
    affine_act: str = 'linear_clip'  # phi of Eq. 7: Eq. 11 (the paper's), or sigmoid (Eq. 10)
    affine_momentum: float = 0.9  # rho of Eq. 9
    # N of Eq. 8: the call's key length (the paper's; with right padding, each row's), or the keys
    # query i sees, N_i = i + 1 (rows then sum to alpha_ma)
    affine_bias_norm: str = 'seq_len'

    def __post_init__(self):
        if isinstance(self.gate, bool):  # a bool before the head-wise gate: True was Eq. 4-5's
            self.gate = 'elementwise' if self.gate else 'none'
        for name, choices in [('attention', ATTENTIONS), ('affine_act', AFFINE_ACTS),
                              ('affine_bias_norm', AFFINE_BIAS_NORMS), ('gate', GATES)]:
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"ModelConfig.{name}={value!r}; valid values: "
                                 + ', '.join(choices))
        if self.gate not in ('none', self.gate_kind):  # a name of GATED_NAMES fixes its gate
            raise ValueError(f"ModelConfig.attention={self.attention!r} has the {self.gate_kind} "
                             f"gate; gate={self.gate!r} contradicts it: leave gate 'none'")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head or self.head_dim % 2:
            raise ValueError("need n_embd % n_head == 0, n_head % n_kv_head == 0 and an even "
                             f"head_dim; got n_embd={self.n_embd}, n_head={self.n_head}, "
                             f"n_kv_head={self.n_kv_head}")
        if not 0.0 <= self.affine_momentum <= 1.0:
            raise ValueError(f"ModelConfig.affine_momentum={self.affine_momentum} "
                             "must be in [0, 1]")
        if self.rope_scaling is not None:
            need = {'rope_type', 'factor', 'low_freq_factor', 'high_freq_factor',
                    'original_max_position_embeddings'}
            if self.rope_scaling.get('rope_type') != 'llama3' or not need <= set(self.rope_scaling):
                raise ValueError("rope_scaling must be None or Llama-3's dict with keys "
                                 f"{sorted(need)} and rope_type='llama3'; got {self.rope_scaling}")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def gate_kind(self):
        """Its output gate, one of GATES: a GATED_NAMES name's, else the gate flag's."""
        return GATED_NAMES[self.attention].gate if self.attention in GATED_NAMES else self.gate

    @property
    def is_gated(self):
        """Whether a gate g_proj follows the attention (Eq. 4-5's, or Qiu et al.'s per head)."""
        return self.gate_kind != 'none'

    @property
    def variant_name(self):
        """The name of its VARIANTS entry (the gate aside: gated's is softmax)."""
        return GATED_NAMES[self.attention].base if self.attention in GATED_NAMES else self.attention

    @property
    def variant(self):
        return VARIANTS[self.variant_name]

    @property
    def outputs_depend_on_length(self):
        """Whether a position's output changes with the tokens after it (affine with
        affine_bias_norm='seq_len': N of Eq. 8 is the call's length): a KV cache is not exact."""
        return self.variant.depends_on_length(self)

    @property
    def hf_native(self):
        """Whether transformers' own Llama / Qwen2 computes it (export_hf.py then ships no code)."""
        return self.variant.hf_native and not self.is_gated


FIELD_NAMES = tuple(f.name for f in fields(ModelConfig))

# The published shapes the paper's students and teachers copy, as ModelConfig fields, from each
# model's config.json on the Hugging Face hub (Qwen/Qwen1.5-0.5B, Qwen/Qwen1.5-1.8B,
# meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B); block_size is the paper's 2,048 tokens.
LLAMA3_ROPE = dict(rope_type='llama3', low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
QWEN = dict(rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6, qkv_bias=True)
LLAMA3 = dict(rope_theta=500000.0, rms_norm_eps=1e-5, qkv_bias=False)
SMOLLM2 = dict(vocab_size=49152, rope_theta=100000.0, rope_scaling=None, rms_norm_eps=1e-5,
               qkv_bias=False, tie_embeddings=True)
MODEL_SHAPES = {
    'qwen1.5-0.5b': dict(QWEN, n_layer=24, n_head=16, n_kv_head=16, n_embd=1024,
                         intermediate_size=2816, tie_embeddings=True, block_size=2048,
                         vocab_size=151936),  # Qwen's padded embedding (151,646 real tokens)
    'qwen1.5-1.8b': dict(QWEN, n_layer=24, n_head=16, n_kv_head=16, n_embd=2048,
                         intermediate_size=5504, vocab_size=151936, tie_embeddings=False,
                         block_size=2048),
    'llama3.2-1b': dict(LLAMA3, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048,
                        intermediate_size=8192, vocab_size=128256, tie_embeddings=True,
                        rope_scaling=dict(LLAMA3_ROPE, factor=32.0), block_size=2048),
    'llama3.2-3b': dict(LLAMA3, n_layer=28, n_head=24, n_kv_head=8, n_embd=3072,
                        intermediate_size=8192, vocab_size=128256, tie_embeddings=True,
                        rope_scaling=dict(LLAMA3_ROPE, factor=32.0), block_size=2048),
    'llama3.1-8b': dict(LLAMA3, n_layer=32, n_head=32, n_kv_head=8, n_embd=4096,
                        intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
                        rope_scaling=dict(LLAMA3_ROPE, factor=8.0), block_size=2048),
    # the one-GPU tier (config/onegpu.py): HuggingFaceTB/SmolLM2-135M and -360M, at 2,048 tokens
    'smollm2-135m': dict(SMOLLM2, n_layer=30, n_head=9, n_kv_head=3, n_embd=576,
                         intermediate_size=1536, block_size=2048),
    'smollm2-360m': dict(SMOLLM2, n_layer=32, n_head=15, n_kv_head=5, n_embd=960,
                         intermediate_size=2560, block_size=2048),
    # not published: the CPU shape of tiny_cpu.py and the quick start (257 byte ids, padded to 320)
    'tiny': dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, intermediate_size=384,
                 vocab_size=320, block_size=256, rope_theta=10000.0, tie_embeddings=True),
}


# ----------------------------------------------------------------------------------------------
# Building blocks shared by every variant: RMSNorm, RoPE, SwiGLU

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32, scale in the input dtype: the order HF's LlamaRMSNorm uses
        xf = at_least_fp32(x)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(config, positions):
    """cos/sin tables (T, head_dim) for the given absolute positions, HF rotate-half layout.
    Computed per forward from the config (cheap: T x head_dim/2) rather than stored, so a model
    built on the meta device needs no re-init."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, device=positions.device).float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    if config.rope_scaling is not None:  # Llama 3.1 frequency scaling (HF "llama3" rope_type)
        s = config.rope_scaling
        old_ctx, low, high, factor = (s['original_max_position_embeddings'], s['low_freq_factor'],
                                      s['high_freq_factor'], s['factor'])
        wavelen = 2 * math.pi / inv_freq
        # 0: long waves, 1: short waves
        smooth = ((old_ctx / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    freqs = positions.float()[..., None] * inv_freq  # positions (T,) or (B, T)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x: (B, H, T, D); cos, sin: (T, D), or (B, T, D) for positions per row. Rotate-half
    convention: pairs (i, i + D/2), as in HF-format checkpoints."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# -----------------------------------------------------------------------------------------------
# The attention variants, one entry of VARIANTS each; attention_kernels.py picks the fused kernel.
# Each is written twice, as functions of the layer `attn` (its config and tensors):
#   forward(attn, q, k, v, visible, **call) -> y (B, H, T, D): the O(T) path. k, v hold every
#       cached key; visible: True (causal), False (one decoded token) or a (B, 1, T, T_k) mask.
#       call: alpha, v_new (this call's values), positions, seq_lens (right padding), cache.
#   weights(attn, scores, **call) -> (B, H, T, T), at least float32, from scores = QK^T / sqrt(d)
#       with hidden keys at -inf: weights @ V is forward's y. call: alpha, positions, seq_lens.

def softmax_forward(attn, q, k, v, visible, **call):
    return softmax_attention(q, k, v, visible)  # Eq. 1


def softmax_weights(attn, scores, **call):
    return torch.softmax(scores, dim=-1)


def sink_tensors(attn, config):
    attn.sinks = nn.Parameter(torch.zeros(config.n_head))  # s_h of Eq. 3, one logit per head


def sink_forward(attn, q, k, v, visible, **call):  # Eq. 3: e^{s_h} joins every denominator
    return sink_attention(q, k, v, attn.sinks, visible)


def sink_weights_of(attn, scores, **call):
    return sink_weights(scores, attn.sinks)  # without the sink's own mass: rows sum to less than 1


def affine_tensors(attn, config):
    attn.alpha_proj = nn.Linear(config.n_embd, config.n_head, bias=False)  # W_alpha of Eq. 7
    attn.register_buffer('alpha_ma', torch.zeros(config.n_head))  # Eq. 9, alpha_ma,0 = 0; saved
    # the sums of alpha and of tokens since the last GPT.update_alpha_ma() (train mode only)
    attn.register_buffer('alpha_sum', torch.zeros(config.n_head), persistent=False)
    attn.register_buffer('alpha_count', torch.zeros(()), persistent=False)


def linear_clip(x):
    """Eq. 11: 0 for x <= -5, 0.1 x + 0.5 in between, 1 for x >= 5."""
    return (0.1 * x + 0.5).clamp(0.0, 1.0)


def affine_alpha(attn, x):
    """Eq. 7: alpha = phi(W_alpha X), one scale per (token, head): (B, T, H), at least float32."""
    a = at_least_fp32(attn.alpha_proj(x))  # Eq. 11, or Eq. 10
    return linear_clip(a) if attn.config.affine_act == 'linear_clip' else torch.sigmoid(a)


def bias_norm(config, positions, seq_lens, n_keys):
    """N of Eq. 8, broadcastable to (B, H, T, 1)."""
    if config.affine_bias_norm == 'visible':  # the keys query i sees; positions (T,) or (B, T)
        return (positions + 1)[..., None, :, None]
    if seq_lens is not None:
        return seq_lens.view(-1, 1, 1, 1)  # right padding: each sequence's real length
    return n_keys  # the key length of the call (with a cache: every cached key)


def affine_scaled(y, alpha, alpha_ma, v_mean):
    """Eq. 6 and 8 without the T x T matrix: [alpha softmax(QK^T / sqrt(d)) + beta] V, beta =
    (alpha_ma - alpha) / N, from the softmax output y = softmax(QK^T / sqrt(d)) V (Eq. 1) and a
    running mean of V. Query i sees only keys j <= i (beta on later keys would leak them), and
    alpha_i, beta_i are constant along a row, so

        sum_{j<=i} [alpha_i a_ij + beta_i] V_j = alpha_i y_i + (alpha_ma - alpha_i) sum_j<=i V_j / N

    O(T) on top of the fused kernel. y (B, H, T, D); alpha (B, T, H), float32; alpha_ma (H,);
    v_mean (B, H_kv, T, D) = (sum_{j<=i} V_j) / N, float32, shared by G query heads (GQA)."""
    B, H, T, D = y.shape
    H_kv = v_mean.size(1)
    G = H // H_kv
    alpha = alpha.transpose(1, 2).unsqueeze(-1).view(B, H_kv, G, T, 1)
    beta_scale = alpha_ma.view(1, H_kv, G, 1, 1) - alpha
    out = alpha * y.view(B, H_kv, G, T, D) + beta_scale * v_mean.unsqueeze(2)
    return out.view(B, H, T, D).to(y.dtype)


def affine_forward(attn, q, k, v, visible, alpha, v_new, positions, seq_lens, cache, **call):
    y = softmax_attention(q, k, v, visible)
    v_sums = at_least_fp32(v_new)
    # padding adds nothing to the sums the cache keeps
    if cache is not None and seq_lens is not None:
        padding = torch.arange(v_new.size(2), device=v_new.device) >= seq_lens[:, None]  # (B, T)
        v_sums = v_sums.masked_fill(padding[:, None, :, None], 0.0)
    v_sums = v_sums.cumsum(dim=2)  # sum_{j<=i} V_j over this call's tokens ...
    if cache is not None:
        v_sums = cache.continue_sum('v_sum', v_sums)  # ... and every cached one before them
    return affine_scaled(y, alpha, attn.alpha_ma,
                         v_sums / bias_norm(attn.config, positions, seq_lens, k.size(2)))


def affine_weights(attn, scores, alpha, positions, seq_lens, **call):
    visible = scores > float('-inf')  # the causal keys, less any the analyses' knockout hides
    seen = visible[0, 0].sum(-1)  # keys per query, alike in every row: N of Eq. 8 counts them
    alpha = alpha.transpose(1, 2).unsqueeze(-1)  # (B, H, T, 1)
    n = bias_norm(attn.config, seen - 1, seq_lens, int(seen.max()))
    beta = (attn.alpha_ma.view(1, -1, 1, 1) - alpha) / n
    return alpha * torch.softmax(scores, dim=-1) + beta * visible  # Eq. 6-8: beta on visible keys


def accumulate_alpha(attn, alpha, positions, seq_lens):
    """Add this micro-batch's sum of alpha (per head) and token count to the layer's running sums
    (Eq. 9's E[alpha], applied by GPT.update_alpha_ma); padding is left out."""
    alpha = alpha.detach()
    if seq_lens is None:
        attn.alpha_sum += alpha.sum(dim=(0, 1))
        attn.alpha_count += alpha.size(0) * alpha.size(1)
    else:
        real = (positions[None, :] < seq_lens[:, None]).unsqueeze(-1)  # (B, T, 1)
        attn.alpha_sum += (alpha * real).sum(dim=(0, 1))
        attn.alpha_count += real.sum()


def softmax1_forward(attn, q, k, v, visible, **call):  # Eq. 2: the sink's logit fixed at 0
    return sink_attention(q, k, v, q.new_zeros(attn.config.n_head), visible)


def softmax1_weights(attn, scores, **call):  # rows sum to less than 1: the 1's share
    return sink_weights(scores, scores.new_zeros(attn.config.n_head))


def init_variant_tensors(attn, std):
    """What a variant adds, initialised as HF Llama would: its own parameters normal(0, init_std)
    (gpt-oss's sinks), its buffers zero (alpha_ma,0 = 0 of Eq. 9); an nn.Linear it adds is
    initialised as every linear."""
    for p in attn._parameters.values():
        nn.init.normal_(p, mean=0.0, std=std)
    for b in attn._buffers.values():
        b.zero_()


def no_more_saved(config, a, x_copy):
    return 0  # a forward that saves nothing for backward beyond softmax attention's


@dataclass(frozen=True)
class Variant:
    """One attention variant: everything the rest of the repository reads about it. A new variant
    declares its O(T) forward, its explicit weights and, if it has parameters, its tensors; every
    other field has a default that says what it does (docs/implementation.md, "Adding your own
    attention")."""
    forward: Callable  # the O(T) path (above)
    weights: Callable  # the explicit T x T form (above): the tests' and the analyses' reference
    # (attn, config): registers what it adds to q/k/v/o_proj, under names of its own (ΔParams)
    tensors: Optional[Callable] = None
    display: Optional[str] = None  # the paper's name for it (analyze.py); None: its own name
    # (config, a, x_copy) -> bytes per token its forward saves beyond softmax's (a: bytes per
    # activation, x_copy: autocast's copy of X or 0): the dry run's plan; None: not planned
    saved_bytes: Optional[Callable] = None
    init: Callable = init_variant_tensors  # (attn, init_std); also after to_empty
    fp32: tuple = ()  # saved buffers kept float32 in every precision (Attention._apply)
    running: tuple = ()  # unsaved float32 per-rank sums, zeroed after loading; DDP must not sync
    alpha: Optional[Callable] = None  # (attn, x) -> (B, T, H): Eq. 7's scale, into alpha_ma
    cache: tuple = ()  # what its KVCache keeps beyond K and V (KVCache.sums' names)
    depends_on_length: Callable = lambda config: False  # ModelConfig.outputs_depend_on_length
    head_stats: tuple = ()  # per-head tensors the analyses plot and train.py logs
    options: Callable = lambda config: ''  # (config) -> its options, shown after its name
    hf_native: bool = False  # transformers' own Llama / Qwen2 computes it (without the gate)
    sink: bool = False  # its rows leave a sink's own mass out: that mass is 1 - the row's sum
    rows_sum_to_one: bool = False  # its weights are a distribution (probes.sink_scores)
    check_time: Optional[float] = None  # gpu_check's ceiling for its 1B step, x softmax's


VARIANTS = {
    'softmax': Variant(softmax_forward, softmax_weights, display='Baseline',
                       saved_bytes=no_more_saved, hf_native=True, rows_sum_to_one=True),
    'sink': Variant(sink_forward, sink_weights_of, sink_tensors, display='Sink',
                    saved_bytes=no_more_saved, head_stats=('sinks',), sink=True, check_time=1.05),
    'affine': Variant(
        affine_forward, affine_weights, affine_tensors, display='Affine-Scaled',
        # alpha_proj's copy of X, alpha (float32) and its views, the running mean of V (float32)
        saved_bytes=lambda config, a, x_copy: x_copy + 12 * config.n_head
                      + 4 * config.n_kv_head * config.head_dim,
        fp32=('alpha_ma',), running=('alpha_sum', 'alpha_count'), alpha=affine_alpha,
        cache=('v_sum',), depends_on_length=lambda config: config.affine_bias_norm == 'seq_len',
        head_stats=('alpha_ma',), check_time=1.03,
        options=lambda c: '' if c.affine_act == 'linear_clip' else f' ({c.affine_act})'),
    'softmax1': Variant(softmax1_forward, softmax1_weights, display='Off-by-One',
                        saved_bytes=no_more_saved, sink=True, check_time=1.05),
}
# Names of variants with a gate: the paper's gated models (Eq. 4-5), and softmax with Qiu et al.'s
# head-wise gate; the paper's five models in order (Tables 1-2); every ModelConfig.attention value
Gated = NamedTuple('Gated', [('base', str), ('gate', str), ('display', str)])  # VARIANTS, GATES
GATED_NAMES = {'gated': Gated('softmax', 'elementwise', 'Gated'),
               'affine_gated': Gated('affine', 'elementwise', 'Affine-Scaled + Gated'),
               'headwise_gated': Gated('softmax', 'headwise', 'Head-wise Gated')}
PAPER_VARIANTS = ('softmax', 'sink', 'gated', 'affine', 'affine_gated')
ATTENTIONS = PAPER_VARIANTS + tuple(n for n in [*VARIANTS, *GATED_NAMES] if n not in PAPER_VARIANTS)
BASELINE, PROPOSED = 'softmax', 'affine'  # the paper's baseline and its own (tools/bench.py)
EXPLICIT = f'{PROPOSED} (explicit T x T)'  # its explicit weights (Attention.explicit)
HEAD_STATS = tuple(dict.fromkeys(name for v in VARIANTS.values() for name in v.head_stats))
SOFTMAX_TENSORS = ('q_proj', 'k_proj', 'v_proj', 'o_proj')


def is_variant_tensor(key):
    """Whether a parameter or state-dict key names a tensor the variant or the gate adds to softmax
    attention (ΔParams; what a softmax checkpoint lacks): sinks, g_proj, alpha_proj, alpha_ma."""
    parts = key.split('.')
    return 'self_attn' in parts and parts[parts.index('self_attn') + 1] not in SOFTMAX_TENSORS


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        H, H_kv, D, C = config.n_head, config.n_kv_head, config.head_dim, config.n_embd
        self.q_proj = nn.Linear(C, H * D, bias=config.qkv_bias)
        self.k_proj = nn.Linear(C, H_kv * D, bias=config.qkv_bias)
        self.v_proj = nn.Linear(C, H_kv * D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.explicit = False  # attend through the explicit T x T weights: the slow reference
        self.hidden_keys = None  # explicit's (T, T) keys hidden beyond causal (the knockout)
        if config.is_gated:  # W_g of Eq. 5: one gate per output channel, or per head (Qiu et al.)
            self.g_proj = nn.Linear(C, H if config.gate_kind == 'headwise' else H * D, bias=False)
        if config.variant.tensors:
            config.variant.tensors(self, config)

    def forward(self, x, cos, sin, positions, seq_lens=None, cache=None, count_alpha=True):
        """x: (B, T, C), the normed X that feeds q/k/v, alpha and the gate. count_alpha=False: the
        caller adds alpha to alpha_ma's sums (activation checkpointing, Block.forward)."""
        B, T, _ = x.shape
        variant = self.config.variant
        q, k, v_new = self.project(x, cos, sin)
        k, v, visible = (k, v_new, True) if cache is None else cache.update(k, v_new, seq_lens)
        alpha = None
        if variant.alpha:
            alpha = variant.alpha(self, x)  # Eq. 7
            if self.training and count_alpha:
                accumulate_alpha(self, alpha, positions, seq_lens)  # for alpha_ma's update, Eq. 9

        if self.explicit:  # the slow reference: the variant's explicit T x T weights (see weights)
            if cache is not None:
                raise ValueError("Attention.explicit computes whole sequences: no KV cache")
            G = self.config.n_head // self.config.n_kv_head
            y = self.weights(x, cos, sin, positions, seq_lens,
                             self.hidden_keys).to(v.dtype) @ v.repeat_interleave(G, 1)
        else:
            y = variant.forward(self, q, k, v, visible, alpha=alpha, v_new=v_new,
                                positions=positions, seq_lens=seq_lens, cache=cache)

        y = y.transpose(1, 2).reshape(B, T, -1)
        if self.config.is_gated:  # Eq. 4-5: Y * sigmoid(X W_g) per channel, before o_proj; or
            # per head (Qiu et al. 2025): Y_h * sigmoid(X W_g)_h on all D channels of head h
            g = torch.sigmoid(self.g_proj(x))  # (B, T, H * D), or (B, T, H)
            y = (y.view(B, T, g.size(-1), -1) * g[..., None]).flatten(2)
        return self.o_proj(y)

    def project(self, x, cos, sin):
        """q (B, H, T, D) and k, v (B, H_kv, T, D), RoPE applied, from the normed x (B, T, C)."""
        B, T, _ = x.shape
        H, H_kv, D = self.config.n_head, self.config.n_kv_head, self.config.head_dim
        q = apply_rope(self.q_proj(x).view(B, T, H, D).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, H_kv, D).transpose(1, 2), cos, sin)
        return q, k, self.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)

    def weights(self, x, cos, sin, positions, seq_lens=None, hidden=None):
        """The attention weights (B, H, T, T), explicit, at least float32 (Variant.weights): what
        the O(T) forward is checked against; weights @ V is its y. hidden: (T, T) bool, keys
        hidden beyond the causal mask (the analyses' knockout). No alpha_ma update."""
        variant = self.config.variant
        q, k, _ = self.project(x, cos, sin)
        alpha = variant.alpha(self, x) if variant.alpha else None
        scores = attention_scores(q, k)
        if hidden is not None:
            scores = scores.masked_fill(hidden, -math.inf)
        return variant.weights(self, scores, alpha=alpha, positions=positions, seq_lens=seq_lens)

    def _apply(self, fn, recurse=True):
        """nn.Module.to/half/bfloat16/cuda/to_empty end here: a cast to half precision leaves the
        variant's float32 buffers (Variant.fp32, .running) in float32 (alpha_ma ~ 0.5 in bf16 is
        off by up to 2e-3; alpha_count would round off past 256). docs/implementation.md."""
        variant = self.config.variant
        before = {name: self._buffers[name] for name in (*variant.fp32, *variant.running)
                  if name in self._buffers}
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
        self.activation_checkpointing = False  # keep only the inputs for backward, recompute

    def forward(self, x, cos, sin, positions, seq_lens=None, cache=None):
        if not (self.activation_checkpointing and torch.is_grad_enabled()):
            return self.compute(x, cos, sin, positions, seq_lens, cache)
        # The recomputation would add affine's alpha to alpha_ma's sums twice: it is counted here,
        # outside it. Checkpointing inside forward keeps this module's hooks (FSDP) out of it.
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


# ----------------------------------------------------------------------------------------------
# The model

class GPT(nn.Module):
    length_note = ''  # why block_size is what it is, where not a checkpoint's length set it

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, config.n_embd),
            layers=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            norm=RMSNorm(config.n_embd, config.rms_norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    @classmethod
    def from_pretrained(cls, path, attention='softmax', dtype=torch.float32, device='cpu'):
        """A GPT from a Hugging Face Llama / Mistral / Qwen2 directory, an export, a checkpoint."""
        from lmkit.loading import load_model  # imported here: model.py stands alone
        return load_model(path, attention, dtype, device, cls=cls)

    def _init_weights(self, module):
        """HF Llama's init: normal(0, init_std) matrices, zero biases, unit norms; a variant's
        tensors as its Variant.init says. Also after to_empty()."""
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
        """idx: (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy or None);
        return_hidden=True: the final normed hidden states replace the logits (for fused losses).
        seq_lens: (B,) real lengths of right-padded rows (affine's N). kv_caches: one KVCache per
        layer; idx goes on after what they hold (each row after its own real tokens)."""
        B, T = idx.shape
        if seq_lens is not None and (seq_lens.shape != (B,) or seq_lens.min() < 1
                                     or seq_lens.max() > T):
            raise ValueError(f"seq_lens must have shape ({B},) with values in [1, {T}], got "
                             f"{seq_lens.tolist()}")
        start = kv_caches[0].length if kv_caches else 0
        positions = (kv_caches[0].positions(T, idx.device) if kv_caches
                     else torch.arange(T, device=idx.device))
        # the tokens a row reaches; past a padded cache, each row goes on from its own real tokens
        end = start + T
        if positions.dim() == 2:
            end = int((positions[:, 0] + (T if seq_lens is None else seq_lens)).max())
        if end > self.config.block_size:
            raise ValueError(f"sequence of {end} tokens is longer than "
                             f"block_size={self.config.block_size}{self.length_note}")
        if return_hidden and targets is not None:
            raise ValueError("return_hidden=True returns hidden states, not logits: compute the "
                             "loss yourself")
        cos, sin = rope_cos_sin(self.config, positions)
        x = self.model.embed_tokens(idx)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, positions, seq_lens, kv_caches[i] if kv_caches else None)
        x = self.model.norm(x)
        if return_hidden:
            return x, None
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                   ignore_index=IGNORE_INDEX)
        return logits, loss

    @torch.no_grad()
    def update_alpha_ma(self, discard=False):
        """Eq. 9, once per optimizer step: alpha_ma <- rho * alpha_ma + (1 - rho) * E[alpha], E over
        every token of the global batch (the forwards' sums, all-reduced over ranks, then cleared).
        Step t's forward uses alpha_ma,t-1 (a constant); our reading where the paper is silent,
        docs/implementation.md. discard=True only clears the sums (a skipped step). Returns E[alpha]
        per layer, (n_head,) tensors (empty: not affine, nothing accumulated, or discarded)."""
        layers = [m.self_attn for m in self.model.layers if m.self_attn.config.variant.alpha]
        if not layers:
            return []
        stats = torch.stack([torch.cat([m.alpha_sum, m.alpha_count.view(1)]) for m in layers])
        for m in layers:
            m.alpha_sum.zero_()
            m.alpha_count.zero_()
        if discard:
            return []
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
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy. Contexts
        keep their last block_size tokens. Where outputs depend on the call's length
        (outputs_depend_on_length) it recomputes; use_cache=True forces the cache (approximate)."""
        if temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError(f"need temperature >= 0 and top_k >= 1 or None, got {temperature}, "
                             f"{top_k}")
        use_cache = not self.config.outputs_depend_on_length if use_cache is None else use_cache
        window, caches = self.config.block_size, None
        cache_len = min(window, idx.size(1) + max_new_tokens)  # what this call can fill, no more
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
        """Number of parameters, tied embeddings counted once; variant_only: those the variant and
        the gate add to softmax attention (the paper's ΔParams)."""
        return sum(p.numel() for name, p in self.named_parameters()
                   if not variant_only or is_variant_tensor(name))
