"""probes.py's sink measures, each against an independent reference: a case built by hand, the
paper's source where the measure is a paper's (Gu et al.'s Sink_1 reimplemented here step by step
from sail-sg/Attention-Sink's pretrain/eval_sink_pretrain.py), transformers' eager attention for
softmax (a tiny Llama built here), and the float64 explicit weights of tests/test_model.py's
REFERENCES for every variant."""
import copy
import math

import numpy as np
import pytest
import torch

from lmkit import probes, sink_costs
from model import ATTENTIONS, GPT, rope_cos_sin
from test_analyze import explicit_weights, tiny_model
from test_model import REFERENCES, gate_reference, variant_name


# -----------------------------------------------------------------------------
# Gu et al.'s Sink_1, written out as sail-sg/Attention-Sink computes it

def gu_metric(attention, epsilon=0.3):
    """pretrain/eval_sink_pretrain.py (evaluate_model), step by step: attention (samples, layers,
    heads, T, T); each key's divisor is the number of queries that see it (T, T - 1, ..., 1, laid
    along the key axis); summed over the queries; thresholded; the share of (layer, head) pairs over
    it per sample. Returns (samples, T)."""
    samples, layers, heads, queries, keys = attention.shape
    divisor = torch.arange(queries, 0, -1)[None, None, None, :].expand(samples, layers, heads,
                                                                       queries, keys)
    importance = (attention / divisor.to(attention)).sum(dim=-2)
    return (importance > epsilon).to(torch.float).mean(dim=(1, 2))


def attnsim_rows(attention):
    """lit_gpt/inference/model_attn_sim_infer.py's weights for analysis: each row over its sum +
    1e-8."""
    return attention / (attention.sum(dim=-1, keepdim=True) + 1e-8)


def kv_bias_rows(attention):
    """lit_gpt/inference/model_kv_bias_infer.py's matrix for a null slot: a zero query and the bias
    key prepended at position 0 (the zero query sees only the bias key: weight 1), every real row
    preceded by the slot's mass."""
    *batch, T, _ = attention.shape
    out = attention.new_zeros(*batch, T + 1, T + 1)
    out[..., 0, 0] = 1
    out[..., 1:, 0] = 1 - attention.sum(-1)
    out[..., 1:, 1:] = attention
    return out


def random_rows(samples=3, layers=2, heads=2, T=6, slot_logit=1.0, seed=0):
    """Causal softmax rows over T tokens and a null slot (rows sum to less than one), with one head
    of layer 0 putting almost everything on token 0 (a sink) and one row of it summing to 0.4."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(samples, layers, heads, T, T, generator=g, dtype=torch.float64)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    scores[:, 0, 0, :, 0] += 6
    slot = torch.full((samples, layers, heads, T, 1), slot_logit, dtype=torch.float64)
    w = torch.softmax(torch.cat([scores, slot], -1), -1)[..., :-1]
    w[:, 0, 1, 3] *= 0.4 / w[:, 0, 1, 3].sum(-1, keepdim=True)
    return w


def test_sink_scores_follow_the_papers_code_on_rows_with_a_null_slot():
    w = random_rows()
    T = w.size(-1)
    assert w[:, 0, 1,
             3].sum(-1).allclose(torch.tensor(0.4, dtype=torch.float64)) and (w.sum(-1) < 1).all()
    tokens, slot = zip(*[(s['tokens'], s['null_slot'])
                         for s in (probes.sink_scores(w[:, l], False, True)
                                                                for l in range(w.size(1)))])
    tokens, slot = torch.stack(tokens, 1), torch.stack(slot, 1)  # (samples, layers, heads)
    # the metric's score, before the >
    importance = lambda a: (a / torch.arange(a.size(-1), 0, -1).to(a)).sum(-2)
    assert torch.allclose(tokens, importance(attnsim_rows(w))[..., 0], rtol=1e-12)
    assert torch.allclose(slot, importance(kv_bias_rows(w))[..., 0], rtol=1e-12)
    # the rates: the share of (layer, head) pairs over 0.3, per sample, then over samples
    assert ((tokens > 0.3).double().mean(dim=(1, 2)) == gu_metric(attnsim_rows(w))[:, 0]).all()
    assert ((slot > 0.3).double().mean(dim=(1, 2)) == gu_metric(kv_bias_rows(w))[:, 0]).all()
    # the sink head counts, the others do not rows that sum to one are read as they are (their
    # softmax models)
    assert 0 < gu_metric(attnsim_rows(w))[:, 0].mean() < 1
    softmax = attnsim_rows(w)
    assert torch.equal(probes.sink_scores(softmax[:, 0], True, False)['tokens'],
                       softmax[:, 0, :, :, 0].sum(-1) / T)


def test_sink_scores_by_hand():
    T = 4
    sink = torch.zeros(1, 1, T, T, dtype=torch.float64)
    sink[..., 0] = 1  # every query on token 0
    uniform = torch.ones(T, T, dtype=torch.float64).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    assert probes.sink_scores(sink, True, False)['tokens'].item() == 1
    assert probes.sink_scores(uniform, True,
                              False)['tokens'].item() == pytest.approx((1 + 1 / 2 + 1 / 3
                                                                        + 1 / 4) / 4)
    # a signed row (affine): magnitudes renormalised; the null slot's score counts the slot's own
    # row (weight 1)
    signed = torch.tensor([[[[0.5, 0, 0], [-0.1, 0.5, 0], [0.2, -0.1, 0.3]]]], dtype=torch.float64)
    scores = probes.sink_scores(signed, False, True)
    assert scores['tokens'].item() == pytest.approx((1 + 0.1 / 0.6 + 0.2 / 0.6) / 3, rel=1e-7)
    assert scores['null_slot'].item() == pytest.approx((1 + 0.5 + 0.6 + 0.6) / 4)


@pytest.mark.parametrize('attention', ATTENTIONS)
def test_sink_rates_and_first_token_measures_of_every_variant(attention):
    """On a tiny model of each variant: Gu et al.'s rates (sink_rates, sink_record) against the
    metric written out above on the float64 reference weights; the first-token measures against the
    weights directly."""
    model = tiny_model(attention).double()
    idx = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    w = torch.stack(explicit_weights(model, idx), 1)  # (samples, layers, heads, T, T)
    rows_sum_to_one, slot = probes.weight_rows(model.config)
    tokens = w if rows_sum_to_one else w.abs() / (w.abs().sum(-1, keepdim=True) + 1e-8)
    rates = sink_costs.sink_rates(model, idx, batch_size=2)
    # (theirs in float32)
    assert rates['sink_rate'] == pytest.approx(gu_metric(tokens)[:, 0].mean().item(), abs=1e-7)
    assert rates['sink_rate_per_layer'] == pytest.approx(
        [(tokens[:, l] / torch.arange(16, 0,
                                      -1).to(w)).sum(-2)[..., 0].gt(0.3).double().mean().item()
         for l in (0, 1)])
    # rows as they are
    assert rates['sink_rate_raw'] == pytest.approx(gu_metric(w)[:, 0].mean().item(), abs=1e-7)
    assert len(rates['sink_rate_raw_per_layer']) == 2
    assert ('sink_rate_null_slot' in rates) == slot
    if slot:
        assert rates[
            'sink_rate_null_slot'] == pytest.approx(gu_metric(kv_bias_rows(w))[:, 0].mean().item())
    record = probes.sink_record(model, idx)
    assert (record['sink_rate'] == rates['sink_rate']
            and record.get('sink_rate_null_slot') == rates.get('sink_rate_null_slot'))
    first, rows = w[..., 1:, 0], w[..., 1:, :].sum(-1)  # queries 1..T-1
    assert record['first_token_weight'] == pytest.approx(first.mean(dim=(0, 2, 3)).tolist(),
                                                         abs=1e-6)
    per_head = lambda key: torch.tensor(record[key], dtype=torch.float64)  # (layers, heads)
    assert torch.allclose(per_head('first_token_share_per_head'), (first / rows).mean(dim=(0, 3)),
                          atol=1e-6)
    assert torch.allclose(per_head('null_mass_per_head'), (1 - rows).mean(dim=(0, 3)), atol=1e-6)
    assert record['first_or_null'] == pytest.approx((first + 1 - rows).mean(dim=(0, 2, 3)).tolist(),
                                                    abs=1e-6)
    assert record['negative_rows'] == pytest.approx((w < 0).any(-1).double().mean(dim=(0, 2,
                                                                                       3)).tolist(),
                                                    abs=1e-6)
    # the earlier measure: heads whose mean first-token weight exceeds 0.3
    heads = first.mean(dim=(0, 3))
    assert record['sink_rate_mean_head'] == (heads > 0.3).double().mean().item()
    if 'affine' in attention:
        # this model's affine rows include negative weights
        assert 0 < max(record['negative_rows']) < 1
        # (layers, B, T, H)
        alpha = torch.stack([a['alpha'] for a in probes.attention_statistics(model, idx)])
        assert record['alpha_std'] == pytest.approx(alpha.flatten(1, 2).std(1).mean(-1).tolist(),
                                                    abs=1e-6)
    if slot:
        assert record['sink_mass'] == record['null_mass']
    else:
        assert 'sink_mass' not in record


def test_alpha_summary_by_hand():
    # (1 sequence, 3 tokens, 2 heads)
    alpha = torch.tensor([[[0.0, 0.5], [1.0, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    s = probes.alpha_summary(alpha)
    assert s['alpha_mean'] == pytest.approx(0.5) and s['alpha_at_0'] == pytest.approx(1 / 6)
    assert s['alpha_at_1'] == pytest.approx(1 / 6)
    # head 0: 0, 1, 0.5 (std 0.5); head 1 constant
    assert s['alpha_std'] == pytest.approx((0.5 + 0) / 2)


# -----------------------------------------------------------------------------
# Kobayashi et al.'s value-weighted share, outliers


@pytest.mark.parametrize('stride', [1, 3])
@pytest.mark.parametrize('attention', ['softmax', 'gated', 'sink', 'affine_gated',
                                       'headwise_gated'])
def test_value_weighted_first_token_against_each_vector(attention, stride):
    """Every contribution w_ij (g_i * v_j) W_O^h built as a vector, one (i, j, h) at a time; with a
    stride, the queries 1, 1 + stride, ... only (T = 8, stride 3: 1, 4, 7). The head-wise gate:
    g_i is head h's one value on all its D channels."""
    model = tiny_model(attention).double()
    attn, cfg = model.model.layers[0].self_attn, model.config
    T, H, D = 8, cfg.n_head, cfg.head_dim
    x = torch.randn(2, T, cfg.n_embd, dtype=torch.float64)
    positions = torch.arange(T)
    cos, sin = rope_cos_sin(cfg, positions)
    w = attn.weights(x, cos, sin, positions).double()
    got = probes.value_weighted_first_token(attn, x, cos, sin, w, stride)
    v = attn.v_proj(x).view(2, T, cfg.n_kv_head, D)
    gate = torch.ones(2, T, H, D, dtype=torch.float64)
    if cfg.is_gated:  # (2, T, H * D), or (2, T, H): head h's value repeated on its D channels
        g = torch.sigmoid(attn.g_proj(x))
        gate = g.view(2, T, H, D) if cfg.gate_kind == 'elementwise' else gate * g[..., None]
    W, group = attn.o_proj.weight, H // cfg.n_kv_head  # (C, H * D); head h reads kv head h // group
    expected = torch.zeros(2, H, dtype=torch.float64)
    for b in range(2):
        for h in range(H):
            shares = []
            for i in range(1, T, stride):
                norms = [(w[b, h, i,
                            j] * (W[:,
                                    h * D:(h + 1) * D] @ (gate[b, i, h] * v[b, j,
                                                                            h // group]))).norm()
                         for j in range(T)]
                shares.append(norms[0] / sum(norms))
            expected[b, h] = torch.stack(shares).mean()
    # the elementwise gate's norms are computed in float32
    assert torch.allclose(got, expected, rtol=1e-5 if cfg.gate_kind == 'elementwise' else 1e-10)


def test_outliers_by_hand_and_on_a_model():
    x = torch.tensor([[[1.0, -2.0], [0.5, 7.0]], [[0.0, 1.0], [-3.0, 0.0]]], dtype=torch.float64)
    assert probes.max_abs(x).tolist() == [7.0, 3.0]
    flat = x.flatten(1).numpy()
    # E[(x - mu)^4] / (s^4 + 1e-6), s with ddof = 1
    for k, row in zip(probes.kurtosis(x).tolist(), flat):
        assert k == pytest.approx(np.mean((row - row.mean()) ** 4) / (np.std(row, ddof=1) ** 4
                                                                      + 1e-6))
    model = tiny_model('gated').double()
    idx = torch.randint(0, 300, (2, 12))
    got = probes.activation_outliers(model, idx)
    h = model.model.embed_tokens(idx)
    positions = torch.arange(12)
    cos, sin = rope_cos_sin(model.config, positions)
    # the residual stream, layer by layer, without hooks
    for layer, stats in zip(model.model.layers, got):
        out = layer.self_attn(layer.input_layernorm(h), cos, sin, positions)
        h = layer(h, cos, sin, positions)
        assert torch.allclose(stats['attention_max_abs'], out.abs().amax(dim=(1, 2)))
        assert torch.allclose(stats['attention_max_abs_after_first'],
                              out[:, 1:].abs().amax(dim=(1, 2)))
        assert torch.allclose(stats['attention_kurtosis_after_first'], probes.kurtosis(out[:, 1:]))
        assert torch.allclose(stats['residual_max_abs'], h.abs().amax(dim=(1, 2)))


def kurtosis_by_hand(values):
    """transformers_language/utils.py's kurtosis of one sequence's flattened values, in numpy
    float64: the mean fourth central moment over (the unbiased variance squared + 1e-6)."""
    values = np.asarray(values, dtype=np.float64)
    return np.mean((values - values.mean()) ** 4) / (np.var(values, ddof=1) ** 2 + 1e-6)


def test_ffn_outliers_against_the_mlp_written_out():
    """The FFN output's max |x| and kurtosis (Bondarenko et al.'s fc2, our down_proj) against the
    SwiGLU MLP written out from its weights on each layer's own input (the residual after attention,
    normed), layer by layer without hooks; each per sequence in numpy, with and without position
    0."""
    model = tiny_model('affine').double()
    idx = torch.randint(0, 300, (3, 12))
    got = probes.activation_outliers(model, idx)
    positions = torch.arange(12)
    cos, sin = rope_cos_sin(model.config, positions)
    h = model.model.embed_tokens(idx)
    with torch.no_grad():
        for layer, stats in zip(model.model.layers, got):
            mid = h + layer.self_attn(layer.input_layernorm(h), cos, sin, positions)
            x, mlp = layer.post_attention_layernorm(mid), layer.mlp
            gate, up = x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T
            ffn = (gate * torch.sigmoid(gate) * up) @ mlp.down_proj.weight.T  # (B, T, C)
            h = mid + ffn
            for suffix, part in (('', ffn), ('_after_first', ffn[:, 1:])):
                rows = part.reshape(len(idx), -1).numpy()
                assert stats[f'ffn_max_abs{suffix}'].tolist() == pytest.approx([np.abs(r).max()
                                                                                for r in rows])
                assert stats[f'ffn_kurtosis{suffix}'].tolist() == pytest.approx([kurtosis_by_hand(r)
                                                                                 for r in rows])
            assert torch.allclose(stats['residual_max_abs'], h.abs().amax(dim=(1, 2)))
    assert got[0]['ffn_kurtosis'][0] != got[0]['attention_kurtosis'][0]  # another module's output


def test_outlier_means_over_batches():
    model = tiny_model('sink').double()
    idx = torch.randint(0, 300, (5, 10))
    once = probes.activation_outliers(model, idx)
    means = sink_costs.outlier_means(model, idx, batch_size=2)  # batches of 2, 2 and 1
    assert set(means) == set(once[0]) and {'ffn_max_abs', 'ffn_kurtosis_after_first'} <= set(means)
    for key, per_layer in means.items():
        assert per_layer == pytest.approx([layer[key].mean().item() for layer in once], rel=1e-12)


# -----------------------------------------------------------------------------
# What a sink costs: W8A8, the knockout


def nearest_on_grid(value, grid):
    """The grid's point nearest value, by trying every point."""
    return min(grid, key=lambda point: abs(point - value))


@pytest.mark.parametrize('bits', [8, 6, 4, 3])
def test_quantizers_pick_the_nearest_point_of_their_grid(bits):
    """At b bits, each value goes to the nearest point of its grid, written out in float64:
    symmetric, the integers -2^(b-1) .. 2^(b-1) - 1 times max|w| / (2^(b-1) - 1); asymmetric over
    [low, high] (widened to hold 0), the integers 0 .. 2^b - 1 less the zero point round(-low /
    step), times step = (high - low) / (2^b - 1): values outside the range go to its ends."""
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(40, generator=g, dtype=torch.float64)
    top = w.abs().max().item()
    step = top / (2 ** (bits - 1) - 1)
    grid = [k * step for k in range(-2 ** (bits - 1), 2 ** (bits - 1))]
    assert sink_costs.quantize_symmetric(w,
                                     bits).tolist() == pytest.approx([nearest_on_grid(v, grid)
                                                                      for v in w.tolist()])
    x = torch.randn(40, generator=g, dtype=torch.float64) * 2 + 0.5
    for low, high in ((-1.3, 2.1), (0.2, 1.7), (-2.5, -0.4)):
        lo, hi = min(low, 0.0), max(high, 1e-8)  # widened to hold 0 (and never empty)
        step = (hi - lo) / (2 ** bits - 1)
        zero = round(-lo / step)
        grid = [(k - zero) * step for k in range(2 ** bits)]
        got = sink_costs.quantize_asymmetric(x, low, high, bits).tolist()
        assert got == pytest.approx([nearest_on_grid(v, grid) for v in x.tolist()], abs=1e-12)
    assert len(set(sink_costs.quantize_asymmetric(x, -1.3, 2.1, bits).tolist())) <= 2 ** bits


def test_quantizers_by_hand():
    w = torch.tensor([-1.0, 0.5, 0.26, 0.001])
    q = sink_costs.quantize_symmetric(w)
    assert q.tolist() == pytest.approx([-1.0, 64 / 127, 33 / 127, 0.0])
    x = torch.tensor([-1.0, 0.0, 1.0, 3.0, 5.0, -2.0])
    step = 4 / 255  # range [-1, 3]: zero point round(1 / step) = 64
    assert sink_costs.quantize_asymmetric(x, -1.0, 3.0).tolist() == pytest.approx(
        [-64 * step, 0.0, round(1 / step) * step, (255 - 64) * step, (255 - 64) * step, -64 * step])
    # [0, 1]
    assert sink_costs.quantize_asymmetric(torch.tensor([0.601]), 0.2,
                                      1.0).item() == pytest.approx(153 / 255)


class QuantizedLinear(torch.nn.Module):
    """A linear layer of the reference: b-bit weights (symmetric) and inputs (asymmetric, fixed
    range) as integers."""

    def __init__(self, linear, low, high, weight_bits=8, act_bits=8):
        super().__init__()
        self.linear, self.low, self.high, self.levels = (linear, min(low, 0.0), max(high, 1e-8),
                                                         2 ** act_bits - 1)
        top = 2 ** (weight_bits - 1)
        scale = linear.weight.abs().max() / (top - 1)
        self.weight = torch.clamp(torch.round(linear.weight / scale), -top, top - 1) * scale

    def forward(self, x):
        scale = (self.high - self.low) / self.levels
        zero = round(-self.low / scale)
        ints = torch.clamp(torch.round(x / scale) + zero, 0, self.levels)
        return torch.nn.functional.linear((ints - zero) * scale, self.weight, self.linear.bias)


def quantized_reference(model, calibration, sequences, weight_bits=8, act_bits=8):
    """The loss of a copy of the model whose linears but lm_head are QuantizedLinear: each linear's
    inputs recorded on the calibration batches (of 2), a running min-max with momentum 0.9 over the
    batches."""
    reference = copy.deepcopy(model).eval()
    names = [n for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear)
             and n != 'lm_head']
    seen = {n: [] for n in names}
    hooks = [reference.get_submodule(n).register_forward_pre_hook(
        lambda m, a, n=n: seen[n].append((a[0].min().item(), a[0].max().item()))) for n in names]
    with torch.no_grad():
        for batch in calibration.split(2):
            reference(batch)
    for hook in hooks:
        hook.remove()
    for n in names:
        low, high = seen[n][0]
        for lo, hi in seen[n][1:]:
            low, high = 0.9 * low + 0.1 * lo, 0.9 * high + 0.1 * hi
        parent, _, child = n.rpartition('.')
        setattr(reference.get_submodule(parent), child,
                QuantizedLinear(reference.get_submodule(n), low, high, weight_bits, act_bits))
    with torch.no_grad():
        return reference(sequences[:, :-1], sequences[:, 1:])[1].item()


def test_w8a8_against_a_model_of_quantized_layers():
    model = tiny_model('affine_gated')
    calibration, sequences = torch.randint(0, 300, (3, 16)), torch.randint(0, 300, (2, 16))
    before = copy.deepcopy(model.state_dict())
    got = sink_costs.w8a8_losses(model, calibration, sequences, batch_size=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # restored
    quantized = quantized_reference(model, calibration, sequences)
    with torch.no_grad():
        _, full = model.eval()(sequences[:, :-1], sequences[:, 1:])
    assert set(got) == {'fp', 'w8a8', 'ratio', 'calibration'}
    assert got['fp'] == pytest.approx(full.item(), rel=1e-5)
    assert got['w8a8'] == pytest.approx(quantized, rel=1e-5) and got['w8a8'] != got['fp']
    assert got['ratio'] == pytest.approx(got['w8a8'] / got['fp']) and got['calibration'] == 3


def test_quantized_losses_at_other_widths_against_a_model_of_quantized_layers():
    """W8A6, W8A4, W4A8 and W3A3 (the study's payoff widths, and one far coarser) against the same
    reference at their widths; each width gives its own loss, and W8A8 is w8a8_losses'."""
    model = tiny_model('gated')
    calibration, sequences = torch.randint(0, 300, (3, 16)), torch.randint(0, 300, (2, 16))
    before = copy.deepcopy(model.state_dict())
    losses = {}
    for weight_bits, act_bits in ((8, 8), (8, 6), (8, 4), (4, 8), (3, 3)):
        got = sink_costs.quantized_losses(model, calibration, sequences, weight_bits, act_bits,
                                      batch_size=2)
        assert got['quantized'] == pytest.approx(quantized_reference(model, calibration, sequences,
                                                                     weight_bits,
                                                                     act_bits), rel=1e-5)
        assert (got['ratio'] == pytest.approx(got['quantized'] / got['fp'])
                and got['calibration'] == 3)
        losses[weight_bits, act_bits] = got['quantized']
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # restored
    assert len(set(losses.values())) == len(losses)
    assert losses[8, 8] == sink_costs.w8a8_losses(model, calibration, sequences,
                                                  batch_size=2)['w8a8']


def hidden_by_hand(T, window, first):
    return torch.tensor([[i - window >= j >= first for j in range(T)] for i in range(T)])


def test_streaming_mask_by_hand():
    hidden = sink_costs.streaming_hidden(6, 2, 1)
    assert torch.equal(hidden, hidden_by_hand(6, 2, 1))
    # keeps token 0 and its last 2 keys
    assert hidden[5].tolist() == [False, True, True, True, False, False]


@torch.no_grad()
def knockout_reference(model, idx, window, first):
    """The model's loss on the predictions of queries i >= window with the hidden keys out of every
    layer's float64 reference matrix (test_model.REFERENCES): zero in exp(scores), and out of
    affine's beta and N (the seen keys: N is the most any query sees, for N = the call's length)."""
    cfg = model.config
    T = idx.size(1) - 1
    hidden = (hidden_by_hand(T, window, first) if first is not None
              else torch.zeros(T, T, dtype=torch.bool))
    visible = torch.ones(T, T, dtype=torch.bool).tril() & ~hidden
    positions = torch.arange(T)
    cos, sin = rope_cos_sin(cfg, positions)
    x = model.model.embed_tokens(idx[:, :-1])
    for layer in model.model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = a.project(h, cos, sin)
        G = cfg.n_head // cfg.n_kv_head
        scores = q @ k.repeat_interleave(G, 1).transpose(-2, -1) / math.sqrt(cfg.head_dim)
        e = torch.where(visible, torch.exp(scores), torch.zeros(()))
        p = {n: t for n, t in [*a.named_parameters(), *a.named_buffers()]}
        seen = torch.full((idx.size(0),), visible.sum(-1).max().item(), dtype=torch.float64)
        A = REFERENCES[variant_name(cfg)](e=e, p=p, x=h, cfg=cfg, visible=visible, seq_lens=seen)
        y = (A @ v.repeat_interleave(G, 1)).transpose(1, 2).flatten(2)
        if cfg.is_gated:
            y = gate_reference(y, h, a.g_proj.weight, cfg)
        x = x + a.o_proj(y)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    logits = model.lm_head(model.model.norm(x))
    return torch.nn.functional.cross_entropy(logits[:, window:].flatten(0, 1),
                                             idx[:, window + 1:].flatten()).item()


@pytest.mark.parametrize('attention', ATTENTIONS)
def test_knockout_against_the_reference_weights_with_keys_removed(attention):
    model = tiny_model(attention).double()
    idx = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(2))
    got = sink_costs.knockout_losses(model, idx, batch_size=2)
    assert got['window'] == 4 and not model.model.layers[0].self_attn.explicit
    assert got['full'] == pytest.approx(knockout_reference(model, idx, 4, None), rel=1e-10)
    # the fast path's
    assert got['full'] == pytest.approx(sink_costs.prediction_loss(model, idx, 2, 4), rel=1e-9)
    for k in sink_costs.KNOCKOUT_FIRST:
        assert got[f'first_{k}'] == pytest.approx(knockout_reference(model, idx, 4, k), rel=1e-10)
    assert got['first_0'] != got['full']
    # keeps every key j < 16: all of them
    nothing_hidden = sink_costs.knockout_losses(model, idx, first=(16,))
    assert nothing_hidden['first_16'] == pytest.approx(nothing_hidden['full'], rel=1e-12)


# -----------------------------------------------------------------------------
# Softmax against transformers' own eager attention


@pytest.fixture(scope='module')
def llama(tmp_path_factory):
    """A tiny randomised Llama saved by transformers, as ours (GPT.from_pretrained) and as
    transformers' own eager."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_helpers import randomise
    path = tmp_path_factory.mktemp('llama')
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, tie_word_embeddings=True))
    randomise(hf, 3)
    hf.save_pretrained(path, safe_serialization=True)
    hf = LlamaForCausalLM.from_pretrained(path, attn_implementation='eager').double().eval()
    return GPT.from_pretrained(str(path)).double(), hf


def test_softmax_measures_equal_transformers_eager_attention(llama, monkeypatch):
    ours, hf = llama
    idx = torch.randint(0, 300, (4, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        # (samples, layers, heads, T, T)
        attentions = torch.stack(hf(idx, output_attentions=True).attentions, 1)
    stats = probes.attention_statistics(ours, idx)
    for layer, a in zip(stats, attentions.unbind(1)):
        # (transformers' eager attention takes its softmax in float32)
        assert torch.allclose(layer['first_token'], a[:, :, 1:, 0].mean(dim=(1, 2)), rtol=1e-6,
                              atol=1e-9)
    # Gu et al.'s setting, T = 64, the rows as they are; this random model has no head over 0.3, so
    # the threshold is also set at the median first-position score, where half the (sample, layer,
    # head) triples count
    importance = (attentions / torch.arange(64, 0, -1).to(attentions)).sum(-2)[..., 0]
    for epsilon in (probes.SINK_THRESHOLD, importance.median().item()):
        monkeypatch.setattr(sink_costs, 'SINK_THRESHOLD', epsilon)
        expected = gu_metric(attentions, epsilon)[:, 0].mean().item()
        assert sink_costs.sink_rates(ours, idx, batch_size=4)['sink_rate'] == pytest.approx(
            expected, abs=1e-7)
    assert 0.3 < expected < 0.7
    # the knockout: transformers' eager attention under an additive mask that hides the same keys
    T, window = 63, 16
    knockout = sink_costs.knockout_losses(ours, idx, window=window)
    for k in sink_costs.KNOCKOUT_FIRST:
        keep = torch.ones(T, T, dtype=torch.bool).tril() & ~hidden_by_hand(T, window, k)
        mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~keep,
                                                                  torch.finfo(torch.float64).min)
        with torch.no_grad():
            logits = hf(idx[:, :-1], attention_mask=mask.expand(4, 1, T, T)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, window:].flatten(0, 1),
                                                 idx[:, window + 1:].flatten())
        assert knockout[f'first_{k}'] == pytest.approx(loss.item(), rel=1e-6)
