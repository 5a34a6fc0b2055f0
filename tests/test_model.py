"""model.py against slow, obviously-correct references.

The reference below builds the explicit masked T x T attention matrix in float64 straight from the
paper's equations (Eq. 1, 3, 4-5, 6-8, 10-11) and its own RoPE (pairwise rotations, not model.py's
tables), then the fast path (flash/SDPA + O(T) identities, custom sink backward) must match it,
forward and backward, on fresh random inputs. Each variant of model.VARIANTS has its own reference
here (REFERENCES): a variant without one fails
test_every_variant_has_a_reference_and_explicit_weights, and every test below runs each registered
variant, with and without the gate.
"""
import copy
import gc
import math
import zlib

import pytest
import torch

from attention_kernels import (SinkAttention, needs_repeated_kv, sink_attention,
                               sink_attention_explicit)
from lmkit.measure import estimate_mfu, flops_per_token
from model import (ATTENTIONS, GATED_NAMES, GPT, VARIANTS, Attention, KVCache, ModelConfig,
                   rope_cos_sin)
from lmkit.runs import configure_optimizers
from train import init_matched

torch.set_num_threads(2)


def tiny_config(**kw):
    base = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=48, vocab_size=97,
                block_size=64, rope_theta=10000.0)
    base.update(kw)
    return ModelConfig(**base)


# ------------------------------------------------------------------------------------------------
# The reference: explicit attention matrix, float64

def reference_angles(T, D, theta):
    inv_freq = [theta ** (-2.0 * i / D) for i in range(D // 2)]
    # (T, D/2)
    return torch.tensor([[p * f for f in inv_freq] for p in range(T)], dtype=torch.float64)


def reference_rotate(t, angles):
    """Rotate pairs (i, i + D/2) by angle[pos, i]: the rotate-half RoPE convention. t: (B, T, H,
    D)."""
    half = t.size(-1) // 2
    c, s = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    t1, t2 = t[..., :half], t[..., half:]
    return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1)


# Each variant's attention matrix A (B, H, T, T), from the paper's equations, in float64: `e` holds
# exp(QK^T / sqrt(d)) on the visible keys (0 on the others), p the layer's parameters and buffers, x
# its input (B, T, C).

def softmax_reference(e, **_):
    return e / e.sum(-1, keepdim=True)  # Eq. 1


def sink_reference(e, p, **_):
    # Eq. 3: e^{s_h} joins the denominator
    return e / (e.sum(-1, keepdim=True) + p['sinks'].exp().view(1, -1, 1, 1))


def affine_reference(e, p, x, cfg, visible, seq_lens, **_):
    B, T = x.shape[:2]
    a = x @ p['alpha_proj.weight'].T  # (B, T, H)
    if cfg.affine_act == 'linear_clip':  # Eq. 11, written piecewise
        alpha = torch.where(a <= -5, torch.zeros(()),
                            torch.where(a >= 5, torch.ones(()), 0.1 * a + 0.5))
    else:
        alpha = 1 / (1 + torch.exp(-a))  # Eq. 10
    alpha = alpha.permute(0, 2, 1)[..., None]  # (B, H, T, 1)
    if cfg.affine_bias_norm == 'visible':
        N = torch.arange(1, T + 1, dtype=torch.float64).view(1, 1, T, 1)
    elif seq_lens is not None:
        N = seq_lens.double().view(B, 1, 1, 1)
    else:
        N = float(T)
    beta = (p['alpha_ma'].view(1, -1, 1, 1) - alpha) / N  # Eq. 8
    # Eq. 6, beta on visible keys only
    return alpha * (e / e.sum(-1, keepdim=True)) + beta * visible


def softmax1_reference(e, **_):
    return e / (e.sum(-1, keepdim=True) + 1)  # Eq. 2 (Miller 2023): 1 joins every denominator


REFERENCES = dict(softmax=softmax_reference, sink=sink_reference, affine=affine_reference,
                  softmax1=softmax1_reference)


def variant_name(cfg):
    """The VARIANTS entry's name of a config (gated: softmax)."""
    return next(name for name, variant in VARIANTS.items() if variant is cfg.variant)


def reference_matrix(attn, x, angles, seq_lens=None):
    """(the attention matrix A (B, H, T, T), V (B, T, H, D) repeated to every query head, the
    parameters), from the paper's equations, in float64."""
    cfg = attn.config
    p = {n: t.double() for n, t in [*attn.named_parameters(), *attn.named_buffers()]}
    x = x.double()
    B, T, _ = x.shape
    H, H_kv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim

    def proj(name):
        y = x @ p[f'{name}.weight'].T
        return y + p[f'{name}.bias'] if f'{name}.bias' in p else y

    q = reference_rotate(proj('q_proj').view(B, T, H, D), angles)
    k = reference_rotate(proj('k_proj').view(B, T, H_kv, D), angles)
    v = proj('v_proj').view(B, T, H_kv, D)
    kv_head = [h // (H // H_kv) for h in range(H)]  # GQA: query head h reads key/value head h // G
    k, v = k[:, :, kv_head], v[:, :, kv_head]
    scores = torch.einsum('bihd,bjhd->bhij', q, k) / math.sqrt(D)
    visible = torch.ones(T, T, dtype=torch.bool).tril()  # key j visible to query i iff j <= i
    e = torch.where(visible, scores.exp(), torch.zeros(()))
    return REFERENCES[variant_name(cfg)](e=e, p=p, x=x, cfg=cfg, visible=visible,
                                         seq_lens=seq_lens), v, p


def reference_attention(attn, x, angles, seq_lens=None):
    """Attention layer output from the paper's equations with an explicit (B, H, T, T) matrix."""
    cfg = attn.config
    A, v, p = reference_matrix(attn, x, angles, seq_lens)
    x = x.double()
    y = torch.einsum('bhij,bjhd->bihd', A, v).flatten(2)
    if cfg.is_gated:
        y = gate_reference(y, x, p['g_proj.weight'], cfg)
    return y @ p['o_proj.weight'].T


def gate_reference(y, x, w_g, cfg):
    """The output gate on the attention output y (B, T, H * D), from x (B, T, C) and W_g: Eq. 4-5's
    sigmoid(X W_g) channel by channel, or Qiu et al. 2025's head-wise gate, head by head: its one
    sigmoid per (token, head) on all of that head's channels."""
    g = torch.sigmoid(x @ w_g.T)
    if cfg.gate_kind == 'elementwise':
        return y * g  # Eq. 4-5
    D = cfg.head_dim
    return torch.cat([y[..., h * D:(h + 1) * D] * g[..., h:h + 1] for h in range(cfg.n_head)], -1)


def test_every_variant_has_a_reference_and_explicit_weights():
    """A variant registered in model.VARIANTS is told to these tests in one place: its float64
    reference above."""
    for name, variant in VARIANTS.items():
        assert name in REFERENCES, (f"attention variant {name!r} has no float64 reference: add "
                                    "one, written from its equations, to REFERENCES in "
                                    "tests/test_model.py")
        assert callable(variant.weights), (f"attention variant {name!r} has no explicit weights "
                                           "(Variant.weights)")


def random_attention(cfg, dtype):
    attn = Attention(cfg)
    # fresh random weights, larger than init so the math is exercised
    for name, t in attn.named_parameters():
        torch.nn.init.normal_(t, std=0.3 if name != 'sinks' else 1.0)
    if hasattr(attn, 'alpha_ma'):
        attn.alpha_ma.uniform_(0.2, 0.8)
    return attn.to(dtype)


def grads_of(attn, x, out, weight):
    (out * weight).sum().backward()
    g = {n: t.grad.double().clone() for n, t in attn.named_parameters()}
    g['input'] = x.grad.double().clone()
    return g


def ungated(gate):
    """The variants that have no name of their own with this gate (elementwise: sink, softmax1)."""
    return [name for name in VARIANTS
            if (name, gate) not in {(g.base, g.gate) for g in GATED_NAMES.values()}]


# Every model: each name of model.ATTENTIONS, and each variant with the elementwise gate where that
# has no name of its own (sink); affine's options too. The layer-level cases add the head-wise gate
# on every variant without a name for it (its code is the same on each: affine's options once).
MODELS = [(a, 'none') for a in ATTENTIONS] + [(a, 'elementwise') for a in ungated('elementwise')]
CASES = [(a, gate, act, norm) for a, gate in MODELS for act, norm in
         ([('linear_clip', 'seq_len'), ('sigmoid', 'seq_len'), ('linear_clip', 'visible')]
          if ModelConfig(attention=a).variant.alpha else [('linear_clip', 'seq_len')])
         ] + [(a, 'headwise', 'linear_clip', 'seq_len') for a in ungated('headwise')]


def case_id(case):
    return '-'.join(str(c) for c in case
                    if c not in ('none', 'linear_clip', 'seq_len')).replace('elementwise', 'gate')


def check_against_reference(attention, gate, act, bias_norm, qkv_bias, device, dtype, tol):
    # a seed of its own per case, the same in every process (hash() of strings changes with
    # PYTHONHASHSEED)
    torch.manual_seed(zlib.crc32(repr((attention, act, bias_norm, qkv_bias)
                                      + {'none': (), 'elementwise': ('gate',)}.get(gate, (gate,))
                                      ).encode()))
    cfg = tiny_config(attention=attention, gate=gate, affine_act=act, affine_bias_norm=bias_norm,
                      qkv_bias=qkv_bias)
    B, T = 3, 37
    attn = random_attention(cfg, torch.float64)
    ref_attn = copy.deepcopy(attn)
    attn = attn.to(device=device, dtype=dtype)
    x_ref = torch.randn(B, T, cfg.n_embd, dtype=torch.float64, requires_grad=True)
    x = x_ref.detach().to(device=device, dtype=dtype).requires_grad_()
    angles = reference_angles(T, cfg.head_dim, cfg.rope_theta)
    # the module takes cos/sin tables; feed it the reference angles
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = (t.to(device=device, dtype=dtype) for t in (emb.cos(), emb.sin()))

    out = attn(x, cos, sin, torch.arange(T, device=device))
    ref = reference_attention(ref_attn, x_ref, angles)
    scale = ref.abs().max()
    assert (out.double().cpu() - ref).abs().max() <= tol * scale

    weight = torch.randn_like(ref)
    g, g_ref = grads_of(attn, x, out, weight.to(device=device, dtype=dtype)), grads_of(ref_attn,
                                                                                       x_ref, ref,
                                                                                       weight)
    assert set(g) == set(g_ref)
    for name in g:
        err = (g[name].cpu() - g_ref[name]).abs().max() / g_ref[name].abs().max().clamp_min(1e-12)
        assert err <= 10 * tol, f'gradient of {name}: relative error {err:.2e}'


@pytest.mark.parametrize('attention,gate,act,bias_norm', CASES, ids=map(case_id, CASES))
@pytest.mark.parametrize('qkv_bias', [False, True])
@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-10), (torch.float32, 2e-5)],
                         ids=['float64', 'float32'])
def test_attention_matches_explicit_reference(attention, gate, act, bias_norm, qkv_bias, dtype,
                                              tol):
    check_against_reference(attention, gate, act, bias_norm, qkv_bias, 'cpu', dtype, tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (run this file on a GPU '
                                                          'machine)')
@pytest.mark.parametrize('attention,gate,act,bias_norm', CASES, ids=map(case_id, CASES))
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)],
                         ids=['float32', 'bfloat16'])
def test_cuda_kernels_match_explicit_reference(attention, gate, act, bias_norm, dtype, tol):
    """CUDA: float32 runs the memory-efficient kernel (sink: its padded LSE), bf16
    FlashAttention-2."""
    torch.backends.cuda.matmul.allow_tf32 = False
    check_against_reference(attention, gate, act, bias_norm, True, 'cuda', dtype, tol)


@pytest.mark.parametrize('attention,gate,act,bias_norm', CASES, ids=map(case_id, CASES))
@pytest.mark.parametrize('qkv_bias', [False, True])
def test_attention_matches_explicit_reference_bf16_cpu(attention, gate, act, bias_norm, qkv_bias):
    """bfloat16 on CPU, GQA included (tiny_config: n_kv_head=2 < n_head=4; CPU's flash kernel reads
    the groups). tol 3e-2 of the output's scale (gradients: check_against_reference's multiple of
    it), as for CUDA bf16: bf16 keeps 8 significant bits (rounding 2^-9 = 2e-3), and the bf16 model
    also rounds the reference's float64 weights, input and RoPE tables, then q, k, v, the attention
    output and o_proj's input. Measured: outputs up to 2.5e-2, gradients up to 3.7e-2 over these
    cases; a wrong head grouping or a dropped term is off by O(1)."""
    check_against_reference(attention, gate, act, bias_norm, qkv_bias, 'cpu', torch.bfloat16, 3e-2)


class RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every aten op that runs inside it, with its arguments (under the composite ops, e.g.
    the kernel that F.scaled_dot_product_attention picked)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))

    def args_of(self, name):
        return [args for op, args in self.calls if op == name]


def has_bthd_layout(t):
    """(B, H, T, D) with (B, T, H, D) memory: what o_proj's reshape and the kernels read without a
    copy."""
    return t.transpose(1, 2).is_contiguous()


def test_gqa_rule_repeats_kv_only_where_no_fused_kernel_takes_groups():
    """One rule for SDPA and the sink: repeat K/V only on CUDA without half precision (the
    memory-efficient kernel takes no GQA in torch <= 2.13, so enable_gqa=True would run the math
    kernel's T x T matrix)."""
    assert needs_repeated_kv('cuda', torch.float32) and needs_repeated_kv('cuda', torch.float64)
    assert not needs_repeated_kv('cuda', torch.bfloat16) and not needs_repeated_kv('cuda',
                                                                                   torch.float16)
    assert not any(needs_repeated_kv('cpu', d)
                   for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64))


@pytest.mark.parametrize('attention', ['softmax', 'sink', 'affine_gated'])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
def test_cpu_flash_kernel_gets_grouped_kv(attention, dtype):
    """On CPU neither SDPA nor the sink's LSE op gets K/V repeated to every query head: the flash
    kernel reads the groups itself, forward and backward (SDPA with enable_gqa=True picks it, not
    the math kernel), and no K/V copy is made. The sink's backward gets grad_out and out in the (B,
    T, H, D) layout, as the model produces them."""
    cfg = tiny_config(attention=attention)  # n_kv_head=2 < n_head=4
    attn = random_attention(cfg, dtype)
    T = 13
    x = torch.randn(2, T, cfg.n_embd, dtype=dtype, requires_grad=True)
    cos, sin = (t.to(dtype) for t in rope_cos_sin(cfg, torch.arange(T)))
    with RecordOps() as forward:
        y = attn(x, cos, sin, torch.arange(T))
    with RecordOps() as backward:
        y.sum().backward()
    (q, k, v, *_), = forward.args_of('_scaled_dot_product_flash_attention_for_cpu')
    (grad_out, _, k_b, v_b, out,
     *_), = backward.args_of('_scaled_dot_product_flash_attention_for_cpu_backward')
    assert (q.size(1) == cfg.n_head
            and k.size(1) == v.size(1) == k_b.size(1) == v_b.size(1) == cfg.n_kv_head)
    assert not forward.args_of('clone')  # what repeat_interleave would run
    # what the math kernel would run
    assert not forward.args_of('bmm') and not backward.args_of('bmm')
    assert attn.k_proj.weight.grad.shape == attn.k_proj.weight.shape
    if attention == 'sink':
        assert has_bthd_layout(grad_out) and has_bthd_layout(out)


@pytest.mark.parametrize('attention', ['softmax', 'sink', 'affine'])
def test_repeated_kv_path_matches_grouped_kv(attention, monkeypatch):
    """Where a kernel takes no groups (CUDA float32, attention_kernels.needs_repeated_kv), K/V reach
    it repeated to every query head. Forced here on CPU: the kernel sees n_head heads, and outputs
    and gradients equal the grouped path's (float64; both are exact up to summation order)."""
    import attention_kernels
    torch.manual_seed(4)
    cfg = tiny_config(attention=attention)
    attn = random_attention(cfg, torch.float64)
    B, T = 2, 17
    x0 = torch.randn(B, T, cfg.n_embd, dtype=torch.float64)
    w = torch.randn(B, T, cfg.n_embd, dtype=torch.float64)
    cos, sin = (t.double() for t in rope_cos_sin(cfg, torch.arange(T)))

    def run():
        x = x0.clone().requires_grad_()
        with RecordOps() as ops:
            out = attn(x, cos, sin, torch.arange(T))
            grads = torch.autograd.grad((out * w).sum(), [x, *attn.parameters()])
        (_, k, *_), = ops.args_of('_scaled_dot_product_flash_attention_for_cpu')
        return out, grads, k.size(1)

    out_grouped, grads_grouped, heads_grouped = run()
    monkeypatch.setattr(attention_kernels, 'needs_repeated_kv', lambda device_type, dtype: True)
    out_repeated, grads_repeated, heads_repeated = run()
    assert (heads_grouped, heads_repeated) == (cfg.n_kv_head, cfg.n_head)
    torch.testing.assert_close(out_repeated, out_grouped, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_repeated, grads_grouped):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize('dtype,tol',
                         [(torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_sink_backward_takes_grad_out_as_received(dtype, tol):
    """grad_out in the (B, T, H, D) memory layout (as o_proj's reshape hands it back) reaches the
    kernel's backward as received: same storage, no clone or copy in the whole backward; `out` is
    saved in that layout. Gradients (grouped K/V, n_kv_head=2 < n_head=4) match the explicit matrix:
    tol of each one's scale; bf16 as above."""
    torch.manual_seed(6)
    B, T, H, H_kv, D = 2, 19, 4, 2, 8

    def bthd_randn(heads):
        return torch.randn(B, T, heads, D, dtype=dtype).transpose(1, 2)

    q, k, v = (bthd_randn(n).requires_grad_() for n in (H, H_kv, H_kv))
    sinks = torch.randn(H, dtype=dtype, requires_grad=True)
    out = sink_attention(q, k, v, sinks, True)
    assert has_bthd_layout(out)
    grad_out = bthd_randn(H)
    with RecordOps() as ops:
        grads = torch.autograd.grad(out, (q, k, v, sinks), grad_out)
    backward, = ops.args_of('_scaled_dot_product_flash_attention_for_cpu_backward')
    g, saved_out = backward[0], backward[4]  # (grad_out, q, k, v, out, lse, ...)
    assert g.data_ptr() == grad_out.data_ptr() and g.stride() == grad_out.stride()
    assert has_bthd_layout(saved_out)
    assert not ops.args_of('clone') and not ops.args_of('copy_')

    exact = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    G = H // H_kv
    ref = sink_attention_explicit(exact[0], exact[1].repeat_interleave(G, 1),
                                  exact[2].repeat_interleave(G, 1), exact[3], True)
    ref_grads = torch.autograd.grad(ref, exact, grad_out.double())
    assert (out.double() - ref).abs().max() <= tol * ref.abs().max()
    for name, a, b in zip('q k v sinks'.split(), grads, ref_grads):
        assert a.shape == b.shape, name
        assert (a.double() - b).abs().max() <= tol * b.abs().max(), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (run this file on a GPU '
                                                          'machine)')
@pytest.mark.parametrize('attention', ['softmax', 'sink'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_cuda_kernels_get_grouped_kv_where_they_take_it(attention, dtype):
    """bf16: the fused kernel (FlashAttention-2 or cuDNN for SDPA, FlashAttention-2 for the sink)
    gets K/V with n_kv_head heads, forward and backward; float32: the memory-efficient kernel gets
    them repeated to n_head (and runs at all: SDPA did not fall back to the math kernel). The sink's
    float32 backward gets grad_out and out in the (B, T, H, D) layout that kernel assumes."""
    cfg = tiny_config(attention=attention)
    attn = random_attention(cfg, dtype).cuda()
    T = 64
    x = torch.randn(2, T, cfg.n_embd, device='cuda', dtype=dtype, requires_grad=True)
    cos, sin = (t.to(dtype) for t in rope_cos_sin(cfg, torch.arange(T, device='cuda')))
    with RecordOps() as ops:
        attn(x, cos, sin, torch.arange(T, device='cuda')).sum().backward()
    kernels = [(name, args) for name, args in ops.calls if name.startswith('_scaled_dot_product_')]
    assert {name.endswith('_backward') for name, _ in kernels} == {False, True}, [name for name,
                                                                                  _ in kernels]
    heads = cfg.n_kv_head if dtype == torch.bfloat16 else cfg.n_head
    # forward ops: (q, k, v, ...); backward ops: (grad_out, q, k, v, ...)
    for name, args in kernels:
        k = args[2] if name.endswith('_backward') else args[1]
        assert k.size(1) == heads, name
        if dtype == torch.float32:
            assert 'efficient' in name, name
    if attention == 'sink' and dtype == torch.float32:
        (grad_out, _, _, _, _, out,
         *_), = ops.args_of('_scaled_dot_product_efficient_attention_backward')
        assert has_bthd_layout(grad_out) and has_bthd_layout(out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (run this file on a GPU '
                                                          'machine)')
@pytest.mark.parametrize('attention', ['softmax', 'sink'])
def test_cuda_float32_gqa_memory_is_linear_in_T(attention):
    """CUDA float32 with GQA at T = 8192: one layer's forward and backward stay far below one
    (n_head, T, T) float32 matrix (2 GiB; the math kernel would build it, and more, for
    softmax(QK^T) and its gradient). The O(T) tensors of this layer come to about 0.3 GiB."""
    T = 8192
    cfg = ModelConfig(n_layer=1, n_head=8, n_kv_head=2, n_embd=512, block_size=T,
                      attention=attention)
    attn = Attention(cfg).cuda()
    x = torch.randn(1, T, cfg.n_embd, device='cuda', requires_grad=True)
    positions = torch.arange(T, device='cuda')
    cos, sin = rope_cos_sin(cfg, positions)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    attn(x, cos, sin, positions).sum().backward()
    torch.cuda.synchronize()
    peak, matrix = torch.cuda.max_memory_allocated() - base, cfg.n_head * T * T * 4
    assert peak < matrix / 4, (f'peak {peak / 2**20:.0f} MiB, '
                               f'one T x T matrix per head {matrix / 2**20:.0f} MiB')


def test_sink_explicit_fallback_matches_reference():
    torch.manual_seed(1)
    B, H, T, D = 2, 3, 19, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.randn(H, dtype=torch.float64, requires_grad=True)
    fast = SinkAttention.apply(q, k, v, sinks, True)
    slow = sink_attention_explicit(q, k, v, sinks, True)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(fast)
    g_fast = torch.autograd.grad((fast * w).sum(), (q, k, v, sinks))
    g_slow = torch.autograd.grad((slow * w).sum(), (q, k, v, sinks))
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    # a sink gradient with the wrong sign would still pass a symmetric check; compare to finite
    # differences
    eps = 1e-6
    s_plus, s_minus = sinks.detach().clone(), sinks.detach().clone()
    s_plus[0] += eps
    s_minus[0] -= eps
    numeric = ((SinkAttention.apply(q, k, v, s_plus, True) * w).sum()
               - (SinkAttention.apply(q, k, v, s_minus, True) * w).sum()) / (2 * eps)
    assert abs(numeric.item() - g_fast[3][0].item()) < 1e-6 * max(1.0, abs(numeric.item()))


def test_rope_tables_match_reference_and_llama3_scaling():
    cfg = tiny_config()
    cos, sin = rope_cos_sin(cfg, torch.arange(50))
    angles = reference_angles(50, cfg.head_dim, cfg.rope_theta)
    torch.testing.assert_close(cos.double(), torch.cat([angles, angles], -1).cos(), rtol=0,
                               atol=2e-5)
    # Llama-3 frequency scaling, written as the piecewise rule (transformers'
    # modeling_rope_utils.py, _compute_llama3_parameters)
    scaling = dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    cfg = tiny_config(n_embd=128, n_head=2, n_kv_head=2, rope_theta=500000.0, rope_scaling=scaling)
    D = cfg.head_dim
    expected, regimes = [], set()
    for i in range(D // 2):
        f = cfg.rope_theta ** (-2.0 * i / D)
        wavelen = 2 * math.pi / f
        if wavelen > 64 / 1.0:
            regimes.add('long: divided by factor')
            expected.append(f / 8.0)
        elif wavelen < 64 / 4.0:
            regimes.add('short: unchanged')
            expected.append(f)
        else:
            regimes.add('between: smoothed')
            smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
            expected.append((1 - smooth) * f / 8.0 + smooth * f)
    assert len(regimes) == 3  # the head_dim/theta above exercise all three regimes
    cos, sin = rope_cos_sin(cfg, torch.tensor([1]))
    got = torch.atan2(sin[0, :D // 2], cos[0, :D // 2]).double()  # position 1: angle = inv_freq
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5,
                               atol=1e-7)


# ------------------------------------------------------------------------------------------------
# Whole model: causality, padding, alpha_ma, KV cache

# every model, and affine's other N
ALL_MODEL_VARIANTS = [(a, gate, 'seq_len') for a, gate in MODELS] + [
    (a, 'none', 'visible') for a in VARIANTS if ModelConfig(attention=a).variant.alpha]


def random_model(attention, bias_norm='seq_len', gate='none', **kw):
    torch.manual_seed(0)
    model = GPT(tiny_config(attention=attention, affine_bias_norm=bias_norm, gate=gate, **kw))
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith('alpha_proj.weight') or name.endswith('sinks'):
                t.normal_(std=1.0)  # spread alpha over its range, make sinks matter
        for m in model.modules():
            if hasattr(m, 'alpha_ma'):
                m.alpha_ma.uniform_(0.2, 0.8)
    return model


@pytest.mark.parametrize('attention,gate,bias_norm', ALL_MODEL_VARIANTS)
@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_causality(attention, gate, bias_norm, mode):
    model = random_model(attention, bias_norm, gate)
    model.train(mode == 'train')
    idx = torch.randint(0, 97, (2, 24))
    for t in (0, 9, 23):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.randint(0, 95, (2,))) % 97
        a, _ = model(idx)
        b, _ = model(changed)
        assert torch.allclose(a[:, :t], b[:, :t], atol=1e-6,
                              rtol=0), f'position < {t} saw token {t}'
        assert not torch.allclose(a[:, t:],
                                  b[:, t:]), 'the changed token must matter from its position on'


@pytest.mark.parametrize('attention,gate,bias_norm', ALL_MODEL_VARIANTS)
def test_right_padding_with_seq_lens_changes_nothing(attention, gate, bias_norm):
    model = random_model(attention, bias_norm, gate).eval()
    lengths = [11, 17, 6]
    seqs = [torch.randint(0, 97, (n,)) for n in lengths]
    padded = torch.zeros(3, 20, dtype=torch.long)
    for i, s in enumerate(seqs):
        padded[i, :len(s)] = s
    logits, _ = model(padded, seq_lens=torch.tensor(lengths))
    for i, s in enumerate(seqs):
        alone, _ = model(s[None])
        torch.testing.assert_close(logits[i, :len(s)], alone[0], rtol=1e-5, atol=1e-5)


def test_affine_seq_len_is_the_call_length_not_visible_count():
    """The two readings of N really differ (so the option is not a no-op). One layer, so that only N
    differs."""
    idx = torch.randint(0, 97, (1, 16))
    a, _ = random_model('affine', 'seq_len', n_layer=1).eval()(idx)
    b, _ = random_model('affine', 'visible', n_layer=1).eval()(idx)
    # last query: N = T = i + 1 in both readings
    assert torch.allclose(a[:, -1], b[:, -1], atol=1e-6)
    assert not torch.allclose(a[:, 0], b[:, 0], atol=1e-3)


def alpha_means(model, idx):
    """Per-layer mean over tokens of alpha (per head), recomputed from each layer's input
    independently."""
    inputs = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda m,
                                                       args: inputs.append(args[0].detach()))
             for layer in model.model.layers]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    out = []
    for layer, x in zip(model.model.layers, inputs):
        a = x.double() @ layer.self_attn.alpha_proj.weight.double().T
        out.append((0.1 * a + 0.5).clamp(0, 1).mean(dim=(0, 1)))
    return out


def test_alpha_ma_ema_update_and_frozen_in_eval():
    model = random_model('affine')
    for m in model.modules():
        if hasattr(m, 'alpha_ma'):
            m.alpha_ma.zero_()
    rho = model.config.affine_momentum
    idx1, idx2 = torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))
    model.train()
    expected1 = alpha_means(model, idx1)  # (train-mode forward; its stats are dropped below)
    model.update_alpha_ma()
    assert all(float(layer.self_attn.alpha_ma.abs().sum()) > 0 for layer in model.model.layers)
    for layer in model.model.layers:  # restart from alpha_ma = 0
        layer.self_attn.alpha_ma.zero_()
    model(idx1)
    means = model.update_alpha_ma()  # the global-batch E[alpha] it applied, per layer
    for mean, e in zip(means, expected1):
        torch.testing.assert_close(mean.double(), e, rtol=1e-5, atol=1e-7)
    for layer, e in zip(model.model.layers, expected1):
        torch.testing.assert_close(layer.self_attn.alpha_ma.double(), (1 - rho) * e, rtol=1e-5,
                                   atol=1e-7)
    before = [layer.self_attn.alpha_ma.clone() for layer in model.model.layers]
    expected2 = alpha_means(model, idx2)
    model.update_alpha_ma()  # the stats of the forward inside alpha_means
    for layer, b, e in zip(model.model.layers, before, expected2):
        torch.testing.assert_close(layer.self_attn.alpha_ma.double(), rho * b.double()
                                   + (1 - rho) * e, rtol=1e-5, atol=1e-7)
    # eval mode: forwards accumulate nothing, so alpha_ma never moves
    frozen = [layer.self_attn.alpha_ma.clone() for layer in model.model.layers]
    model.eval()
    model(idx1)
    assert model.update_alpha_ma() == []
    for layer, f in zip(model.model.layers, frozen):
        assert torch.equal(layer.self_attn.alpha_ma, f)


def test_alpha_ma_discard_clears_a_skipped_step():
    model = random_model('affine').train()
    before = [layer.self_attn.alpha_ma.clone() for layer in model.model.layers]
    model(torch.randint(0, 97, (2, 8)))
    assert model.update_alpha_ma(discard=True) == []
    assert model.update_alpha_ma() == []  # the discarded sums are gone
    assert all(torch.equal(layer.self_attn.alpha_ma, b) for layer,
               b in zip(model.model.layers, before))


def test_alpha_ma_invariant_to_micro_batch_split():
    base = random_model('affine_gated')
    one, four = copy.deepcopy(base).train(), copy.deepcopy(base).train()
    idx = torch.randint(0, 97, (4, 16))
    one(idx)
    for i in range(4):
        four(idx[i:i + 1])
    one.update_alpha_ma(), four.update_alpha_ma()
    for a, b in zip(one.model.layers, four.model.layers):
        torch.testing.assert_close(a.self_attn.alpha_ma, b.self_attn.alpha_ma, rtol=1e-6, atol=1e-7)
        assert not torch.equal(a.self_attn.alpha_ma, base.model.layers[0].self_attn.alpha_ma)


def test_alpha_ma_state_dict_holds_the_moving_average_only():
    sd = random_model('affine').state_dict()
    assert 'model.layers.0.self_attn.alpha_ma' in sd
    assert not any('alpha_sum' in k or 'alpha_count' in k for k in sd)


def test_alpha_stats_stay_float32_when_the_model_is_cast_to_half_precision():
    """bf16 evaluation casts the whole model: affine's alpha_ma, alpha_sum and alpha_count stay
    float32 and unchanged (in bf16, alpha_ma ~ 0.5 would be off by up to 2e-3 and the count stuck
    past 256), through state_dict / load_state_dict / deepcopy, and when built on the meta device,
    cast, then materialised (GPT.from_pretrained's way); float64 and device moves still apply to
    them."""
    model = random_model('affine').train()
    # 305 tokens counted: bf16 has no 305 (steps of 2 above 256)
    model(torch.randint(0, 97, (5, 61)))
    stats = dict(model.named_buffers())
    assert (len(stats) == 3 * model.config.n_layer
            and stats['model.layers.0.self_attn.alpha_count'].item() == 305)

    def same_stats(m, dtype=torch.float32):
        return all(b.dtype == dtype and torch.equal(b, stats[name].to(dtype)) for name,
                   b in m.named_buffers())

    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.to('cpu', torch.float16),
                 lambda m: m.bfloat16(), lambda m: m.half()):
        m = cast(copy.deepcopy(model))
        assert m.lm_head.weight.dtype in (torch.bfloat16, torch.float16) and same_stats(m)
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    assert same_stats(m16.double(),
                      torch.float64) and same_stats(copy.deepcopy(model).double().bfloat16())
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    sd = m16.state_dict()
    assert sd['model.layers.1.self_attn.alpha_ma'].dtype == torch.float32
    fresh = GPT(model.config).to(torch.bfloat16)
    fresh.load_state_dict(sd)
    for loaded, saved in zip(fresh.model.layers, m16.model.layers):
        assert loaded.self_attn.alpha_ma.dtype == torch.float32
        assert torch.equal(loaded.self_attn.alpha_ma, saved.self_attn.alpha_ma)
    assert same_stats(copy.deepcopy(m16))
    with torch.device('meta'):
        meta = GPT(model.config).to(torch.bfloat16)
    assert all(b.is_meta and b.dtype == torch.float32 for b in meta.buffers())
    meta.to_empty(device='cpu')
    assert all(b.device.type == 'cpu' and b.dtype == torch.float32 for b in meta.buffers())
    m16(torch.randint(0, 97, (5, 61)))  # a bf16 model keeps counting in float32
    assert (m16.model.layers[0].self_attn.alpha_count.item() == 610
            and len(m16.update_alpha_ma()) == 2)


def test_bf16_affine_output_uses_the_float32_alpha_ma():
    """The bf16 model's beta term (Eq. 8) uses alpha_ma at float32 precision. alpha = 0 here (a
    constant input channel drives Eq. 11 below -5), so the output is o_proj(alpha_ma * mean of the
    visible V), linear in each head's alpha_ma; alpha_ma sits 0.49 bf16 steps (2^-8 here) above bf16
    numbers near 0.5, so a bf16 alpha_ma would scale the output down by ~0.38%. bf16's rounding
    elsewhere is unbiased: the least-squares scale of the output against a float64 reference of the
    same bf16 weights and input is 1 within 1.5e-3 only with the float32 alpha_ma (measured over 10
    seeds: |scale - 1| <= 5e-4 with it, >= 3.2e-3 with alpha_ma rounded to bf16). Elementwise, the
    output matches within bf16's 3e-2 (see the bf16 reference test)."""
    torch.manual_seed(8)
    cfg = tiny_config(attention='affine')
    attn = random_attention(cfg, torch.float32)
    with torch.no_grad():
        attn.alpha_proj.weight.zero_()
        attn.alpha_proj.weight[:, 0] = -10.0
        attn.alpha_ma.copy_(0.5 + 2.0 ** -8 * torch.tensor([0.49, 2.49, 4.49, 6.49]))
    alpha_ma = attn.alpha_ma.clone()
    attn = attn.to(torch.bfloat16)
    assert attn.alpha_ma.dtype == torch.float32 and torch.equal(attn.alpha_ma, alpha_ma)
    B, T = 4, 48
    x = torch.randn(B, T, cfg.n_embd).to(torch.bfloat16)
    x[..., 0] = 1.0
    angles = reference_angles(T, cfg.head_dim, cfg.rope_theta)
    emb = torch.cat([angles, angles], dim=-1)
    out = attn(x, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16),
               torch.arange(T)).double()
    # alpha_ma: the float32 values
    ref = reference_attention(copy.deepcopy(attn).double(), x.double(), angles)
    assert (out - ref).abs().max() <= 3e-2 * ref.abs().max()
    scale = (out * ref).sum() / (ref * ref).sum()
    assert abs(scale.item() - 1) < 1.5e-3, f'output scaled by {scale.item():.5f}'


@pytest.mark.parametrize('attention,gate,bias_norm', ALL_MODEL_VARIANTS)
def test_kv_cache_decoding_equals_full_recomputation(attention, gate, bias_norm):
    model = random_model(attention, bias_norm, gate, block_size=24).eval()
    idx = torch.randint(0, 97, (2, 7))
    # there N is the whole call's length
    exact = (variant_name(model.config), bias_norm) != ('affine', 'seq_len')
    assert model.config.outputs_depend_on_length == (not exact)
    if exact:  # step by step: the cached logits equal the full forward's last-position logits
        caches = [KVCache(24) for _ in range(model.config.n_layer)]
        logits, _ = model(idx, kv_caches=caches)
        # what the cache keeps beyond K and V
        assert set(caches[0].sums) == set(model.config.variant.cache)
        seq = idx
        for _ in range(10):
            full, _ = model(seq)
            torch.testing.assert_close(logits[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)
            seq = torch.cat([seq, full[:, -1].argmax(-1, keepdim=True)], dim=1)
            logits, _ = model(seq[:, -1:], kv_caches=caches)
    # generate(): cached (default where exact) vs recompute, past block_size (window slides, cache
    # refills)
    cached = model.generate(idx, 30, temperature=0)
    recomputed = model.generate(idx, 30, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed)
    expected = idx  # and recomputation is exactly the greedy argmax of the full forward
    for _ in range(30):
        logits, _ = model(expected[:, -24:])
        expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(recomputed, expected)


@pytest.mark.parametrize('attention,gate,bias_norm', ALL_MODEL_VARIANTS)
def test_a_ragged_kv_cache_scores_continuations_as_whole_sequences(attention, gate, bias_norm):
    """What zeroshot.score_requests does with a KV cache, against the whole sequences in float64:
    three contexts of different lengths in one right-padded prefill, fanned out to five
    continuations (one token, and many; a context read by two, one by none), right-padded again:
    each row's real positions give the logits of its own context + continuation computed whole.
    Where outputs depend on the call's length (affine, seq_len), the model says so and the scorer
    never uses a cache."""
    model = random_model(attention, bias_norm, gate, block_size=24).double().eval()
    if model.config.outputs_depend_on_length:
        assert (variant_name(model.config), bias_norm) == ('affine', 'seq_len')
        return
    g = torch.Generator().manual_seed(1)
    contexts = [torch.randint(0, 97, (n,), generator=g) for n in (5, 1, 9)]
    rows, lengths = [0, 0, 2, 2, 2], [1, 4, 3, 1, 6]
    continuations = [torch.randint(0, 97, (n,), generator=g) for n in lengths]
    caches = [KVCache(9 + 6) for _ in range(model.config.n_layer)]
    prefill, _ = model(pad(contexts), seq_lens=torch.tensor([5, 1, 9]), kv_caches=caches)
    fanned = [cache.select(torch.tensor(rows)) for cache in caches]
    logits, _ = model(pad(continuations), seq_lens=torch.tensor(lengths), kv_caches=fanned)
    for b, context in enumerate(contexts):
        whole, _ = model(context[None])
        torch.testing.assert_close(prefill[b, :len(context)], whole[0], rtol=1e-10, atol=1e-10)
    for r, (b, continuation) in enumerate(zip(rows, continuations)):
        whole, _ = model(torch.cat([contexts[b], continuation])[None])
        torch.testing.assert_close(logits[r, :len(continuation)], whole[0, len(contexts[b]):],
                                   rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match='no room for 7 more'):
        model(torch.zeros(5, 7, dtype=torch.long),
              kv_caches=[cache.select(torch.tensor(rows)) for cache in caches])
    with pytest.raises(ValueError, match='longer than block_size=24'):  # row 2: 9 real tokens + 16
        model(torch.zeros(5, 16, dtype=torch.long),
              kv_caches=[cache.select(torch.tensor(rows)) for cache in caches])


def pad(sequences):
    """Right-padded (B, longest) token ids, padding id 0."""
    x = torch.zeros(len(sequences), max(len(s) for s in sequences), dtype=torch.long)
    for b, s in enumerate(sequences):
        x[b, :len(s)] = s
    return x


def test_affine_seq_len_cache_is_an_approximation_only_when_forced():
    model = random_model('affine', 'seq_len').eval()
    idx = torch.randint(0, 97, (1, 5))
    caches = [KVCache(64) for _ in range(2)]
    model(idx[:, :4], kv_caches=caches)
    cached, _ = model(idx[:, 4:], kv_caches=caches)
    full, _ = model(idx)
    # why generate() recomputes by default
    assert not torch.allclose(cached[:, -1], full[:, -1], atol=1e-4)


def test_sampling_is_reproducible_and_respects_top_k():
    model = random_model('sink').eval()
    idx = torch.randint(0, 97, (3, 4))
    torch.manual_seed(5)
    a = model.generate(idx, 12, temperature=0.8, top_k=5)
    torch.manual_seed(5)
    b = model.generate(idx, 12, temperature=0.8, top_k=5, use_cache=False)
    assert torch.equal(a, b)
    greedy = model.generate(idx, 1, temperature=0)
    top1 = model.generate(idx, 1, temperature=1.0, top_k=1)
    assert torch.equal(greedy, top1)
    with pytest.raises(ValueError, match='temperature'):
        model.generate(idx, 1, temperature=-1)


# ------------------------------------------------------------------------------------------------
# Interfaces: loss, hidden states, optimizer groups, FLOPs, config validation

def test_loss_hidden_states_and_ignore_index():
    model = random_model('affine')
    idx = torch.randint(0, 97, (2, 10))
    targets = torch.randint(0, 97, (2, 10))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 10, 97)
    manual = torch.nn.functional.log_softmax(logits.double(), -1).gather(-1,
                                                                         targets[...,
                                                                                 None]).mean().neg()
    torch.testing.assert_close(loss.double(), manual, rtol=1e-5, atol=1e-6)
    hidden, none = model(idx, return_hidden=True)
    assert none is None and hidden.shape == (2, 10, model.config.n_embd)
    torch.testing.assert_close(model.lm_head(hidden), logits)
    targets[:, :5] = -100
    _, partial = model(idx, targets)
    manual = (torch.nn.functional.log_softmax(logits.double(), -1)[:, 5:]
              .gather(-1, targets[:, 5:, None]).mean().neg())
    torch.testing.assert_close(partial.double(), manual, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='block_size'):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_optimizer_groups_and_tied_embeddings():
    model = random_model('sink', qkv_bias=True, tie_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    opt = configure_optimizers(model, weight_decay=0.1, lr=1e-3, betas=(0.9, 0.95))
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    assert all(names[id(p)].endswith(('norm.weight', 'bias', 'sinks')) for p in no_decay['params'])
    assert all(names[id(p)].endswith(('proj.weight', 'embed_tokens.weight'))
               for p in decay['params'])
    assert sum(p.numel() for g in opt.param_groups for p in g['params']) == model.get_num_params()


def test_flops_per_token_formula():
    cfg = tiny_config(attention='affine_gated', tie_embeddings=True)
    model = GPT(cfg)
    L, C, H, Hkv, D, I, V, T = 2, 32, 4, 2, 8, 48, 97, 64
    # q,o + k,v + mlp + alpha + gate
    per_layer = C * H * D * 2 + 2 * C * Hkv * D + 3 * C * I + C * H + C * H * D
    assert flops_per_token(model) == 6 * (L * per_layer + V * C) + 12 * L * H * D * T
    assert estimate_mfu(model, 4, 2.0,
                        1e9) == pytest.approx(flops_per_token(model) * T * 4 / 2.0 / 1e9)


def test_config_validation_messages():
    with pytest.raises(ValueError, match='softmax, sink, gated, affine, affine_gated'):
        ModelConfig(attention='linear')
    with pytest.raises(ValueError, match='linear_clip, sigmoid'):
        ModelConfig(affine_act='relu')
    with pytest.raises(ValueError, match='n_kv_head'):
        ModelConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match='rope_scaling'):
        ModelConfig(rope_scaling={'factor': 8.0})
    with pytest.raises(ValueError, match='seq_lens'):
        random_model('affine')(torch.zeros(2, 5, dtype=torch.long), seq_lens=torch.tensor([3, 6]))


def test_the_gate_flag_names_its_kind_and_reads_the_bools_it_was():
    """ModelConfig.gate is one of GATES; True and False, its values before the head-wise gate, read
    as the kinds they meant (old checkpoints, config.json files, gate=True in Python). A name of
    GATED_NAMES fixes its gate: the same kind again is allowed, another is refused. Anything else is
    a one-line error that lists the valid values. W_g is H * D wide, or one column per head."""
    for gate, kind in [(False, 'none'), (True, 'elementwise'), ('none', 'none'),
                       ('elementwise', 'elementwise'), ('headwise', 'headwise')]:
        cfg = tiny_config(attention='sink', gate=gate)
        assert (cfg.gate, cfg.gate_kind, cfg.is_gated) == (kind, kind, kind != 'none')
        g_proj = getattr(Attention(cfg), 'g_proj', None)  # W_g: (H * D, C), or (H, C)
        assert (None if g_proj is None else tuple(g_proj.weight.shape)) == {
            'none': None, 'elementwise': (4 * 8, 32), 'headwise': (4, 32)}[kind]
    for attention, kind in [('softmax', 'none'), ('gated', 'elementwise'),
                            ('affine_gated', 'elementwise'), ('headwise_gated', 'headwise')]:
        for gate in ('none', kind, kind == 'elementwise'):
            assert ModelConfig(attention=attention, gate=gate).gate_kind == kind
    with pytest.raises(ValueError, match=r"^ModelConfig.attention='gated' has the elementwise "
                                         r"gate; gate='headwise' contradicts it"):
        ModelConfig(attention='gated', gate='headwise')
    for bad in ('head', 'True', None, 1, 0.5):
        with pytest.raises(ValueError) as error:
            ModelConfig(gate=bad)
        assert str(error.value) == (f"ModelConfig.gate={bad!r}; valid values: none, elementwise, "
                                    "headwise")


@pytest.mark.parametrize('attention,gate', [('headwise_gated', 'none'), ('sink', 'headwise')])
def test_headwise_gate_gradients_against_finite_differences(attention, gate):
    """The head-wise gate's gradients, of W_g and of the layer's input, against
    torch.autograd.gradcheck's central differences, float64, GQA."""
    torch.manual_seed(5)
    cfg = tiny_config(attention=attention, gate=gate)
    attn = random_attention(cfg, torch.float64)
    T = 6
    positions = torch.arange(T)
    cos, sin = (t.double() for t in rope_cos_sin(cfg, positions))
    x = torch.randn(2, T, cfg.n_embd, dtype=torch.float64, requires_grad=True)
    w_g = attn.g_proj.weight.detach().clone().requires_grad_()

    def layer(x, w_g):
        return torch.func.functional_call(attn, {'g_proj.weight': w_g}, (x, cos, sin, positions))
    assert torch.autograd.gradcheck(layer, (x, w_g))


def _ddp_alpha_worker(rank, world_size, init_file, idx, result_file):
    import torch.distributed as dist
    from lmkit.distributed import DDP_NO_BUFFER_SYNC
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world_size)
    try:
        model = random_model('affine').train()
        ddp = torch.nn.parallel.DistributedDataParallel(model, **DDP_NO_BUFFER_SYNC)
        shard = idx[rank::world_size]  # each rank sees only its part; two micro-batches per rank
        for micro in shard.split(1):
            ddp(micro)
        model.update_alpha_ma()
        if rank == 0:
            torch.save([layer.self_attn.alpha_ma for layer in model.model.layers], result_file)
        # Free DDP (its reducer sits in reference cycles) before the process group: left to the
        # collector at exit, gloo aborted a rank ('terminate called without an active exception') in
        # ~1 run of 25.
        dist.barrier()
        del ddp
        gc.collect()
    finally:
        dist.destroy_process_group()


def test_alpha_ma_is_global_batch_exact_under_ddp(tmp_path):
    """2 gloo ranks x 2 micro-batches of 1 sequence give the same alpha_ma as 1 process with the
    batch of 4."""
    idx = torch.randint(0, 97, (4, 16))
    torch.multiprocessing.spawn(_ddp_alpha_worker,
                                args=(2, str(tmp_path / 'init'), idx, str(tmp_path / 'out.pt')),
                                nprocs=2, join=True)
    single = random_model('affine').train()
    single(idx)
    single.update_alpha_ma()
    for got, layer in zip(torch.load(tmp_path / 'out.pt'), single.model.layers):
        torch.testing.assert_close(got, layer.self_attn.alpha_ma, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('attention,gate,act,bias_norm', CASES, ids=map(case_id, CASES))
def test_explicit_weights_reproduce_the_forward(attention, gate, act, bias_norm):
    """Attention.weights (the analysis path) is the reference's matrix, and @ V, then gate and
    o_proj, equals the fast forward: the analyses see exactly the attention the model computes. Also
    the row sums each variant implies."""
    torch.manual_seed(3)
    cfg = tiny_config(attention=attention, gate=gate, affine_act=act, affine_bias_norm=bias_norm)
    attn = random_attention(cfg, torch.float64)
    B, T = 2, 19
    x = torch.randn(B, T, cfg.n_embd, dtype=torch.float64)
    positions = torch.arange(T)
    angles = reference_angles(T, cfg.head_dim, cfg.rope_theta)
    cos, sin = torch.cat([angles, angles], dim=-1).cos(), torch.cat([angles, angles], dim=-1).sin()
    w = attn.weights(x, cos, sin, positions)
    assert w.shape == (B, cfg.n_head, T, T) and (w.triu(1) == 0).all()  # causal
    torch.testing.assert_close(w, reference_matrix(attn, x, angles)[0], rtol=1e-10, atol=1e-12)
    _, _, v = attn.project(x, cos, sin)
    y = (w @ v.repeat_interleave(cfg.n_head // cfg.n_kv_head, dim=1)).transpose(1, 2).reshape(B, T,
                                                                                              -1)
    if cfg.is_gated:
        y = gate_reference(y, x, attn.g_proj.weight, cfg)
    torch.testing.assert_close(attn.o_proj(y), attn(x, cos, sin, positions), rtol=1e-10, atol=1e-12)
    rows = w.sum(-1)
    if variant_name(cfg) == 'softmax':
        torch.testing.assert_close(rows, torch.ones_like(rows))
    elif variant_name(cfg) == 'sink':
        assert (rows < 1).all()
    elif bias_norm == 'visible':  # every row sums to alpha_ma of its head
        torch.testing.assert_close(rows, attn.alpha_ma.view(1, -1, 1).expand_as(rows))


# (the gate on every variant: the layer-level test above)
@pytest.mark.parametrize('attention', ATTENTIONS)
def test_explicit_attention_equals_the_fast_path(attention):
    """Attention.explicit (Attention.weights @ V: the written T x T form of Eq. 1, 3, 6-8,
    tools/bench.py's peer) and the O(T) fused path give the same logits and gradients, in float64,
    GQA, for both of affine's N."""
    for bias_norm in ('seq_len', 'visible'):
        torch.manual_seed(0)
        fast = GPT(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64,
                               vocab_size=50,
                               block_size=24, attention=attention,
                               affine_bias_norm=bias_norm)).double()
        # nonzero alpha_ma and sinks: beta and the sink's mass matter
        for layer in fast.model.layers:
            if hasattr(layer.self_attn, 'alpha_ma'):
                layer.self_attn.alpha_ma.uniform_(0.2, 0.8)
        explicit = copy.deepcopy(fast)
        for layer in explicit.model.layers:
            layer.self_attn.explicit = True
        idx = torch.randint(0, 50, (3, 24))
        outs = []
        for model in (fast, explicit):
            logits, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
        assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-10)
        for name, grad in outs[0][1].items():
            assert torch.allclose(grad, outs[1][1][name], rtol=1e-9, atol=1e-11), name


# -----------------------------------------------------------------------------------------------
# Matched initialisation (train.py's matched_init): the sink study v2's pairs start from the same
# shared tensors

def sink_study_model(attention, seed, matched):
    """The model train.py builds for config/sink_study.py at this seed (train.build_model: the seed,
    then GPT)."""
    import train
    from model import FIELD_NAMES
    c = train.load_config(['config/sink_study.py', f'--attention={attention}', f'--seed={seed}'])
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**{k: c[k] for k in FIELD_NAMES}))
    if matched:
        init_matched(model, seed)
    return model


def test_matched_init_shares_every_tensor_the_variants_share():
    """With matched_init, every variant of one seed starts equal in each tensor it shares with
    another, whatever it adds; its own tensors are initialised as the default init would (alpha_proj
    normal(0, init_std), alpha_ma 0); another seed gives other values; and the global RNG is where
    it was."""
    states = {}
    for attention in ATTENTIONS:
        states[attention] = sink_study_model(attention, 7, matched=True).state_dict()
    softmax = states['softmax']
    for attention, state in states.items():
        shared = [k for k in state if k in softmax]
        # every variant holds softmax's tensors, and adds its own
        assert len(shared) == len(softmax)
        assert all(torch.equal(state[k], softmax[k]) for k in shared), attention
    affine = states['affine']
    alpha = affine['model.layers.0.self_attn.alpha_proj.weight']
    assert alpha.std().item() == pytest.approx(0.02,
                                               rel=0.15) and not affine[
        'model.layers.0.self_attn.alpha_ma'].any()
    other = sink_study_model('softmax', 8, matched=True).state_dict()
    assert not torch.equal(other['model.embed_tokens.weight'], softmax['model.embed_tokens.weight'])
    model = sink_study_model('softmax', 7, matched=False)
    state = torch.get_rng_state()
    init_matched(model, 7)
    assert torch.equal(torch.get_rng_state(), state)
    # without it (the default, v1's), a variant's own modules draw from the one stream: shared
    # tensors differ
    default = {a: sink_study_model(a, 7, matched=False).state_dict() for a in ('softmax', 'affine')}
    differ = [k for k in default['softmax']
              if not torch.equal(default['softmax'][k], default['affine'][k])]
    assert 'model.layers.3.mlp.down_proj.weight' in differ


def test_the_default_init_is_v1s():
    """matched_init=False is the init the committed v1 study trained from (a fresh ce_softmax_s1
    reproduced its record bit for bit): the sha256 of its initial weights, pinned when matched_init
    was added."""
    import hashlib
    digest = hashlib.sha256()
    for name, tensor in sink_study_model('softmax', 1, matched=False).state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    assert digest.hexdigest() == '3498eeed50103d7cc0417282d6ab1acbea8bf153066f88b958e4a8bca3d2dde7'
