"""The measures over many sequences, batch by batch, for analyze.py attention and the end of a sink
study run: every per-layer statistic of lmkit/probes.py reduced to plain numbers (model_statistics),
Gu et al.'s sink rate in their own setting (sink_rates), the activation outliers (outlier_means),
and what a sink costs: the loss under W8A8 quantization (w8a8_losses, quantized_losses) and under
StreamingLLM's first-token knockout (knockout_losses). train.py reads none of it.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmkit.inspection import eager_eval, head_stats, inspect_attention
from lmkit.probes import (SINK_THRESHOLD, activation_outliers, attention_statistics, layer_mean,
                          layer_summary, model_rates, sink_scores, weight_rows)

# Gu et al.'s own setting: 100 samples of 64 tokens (pretrain/eval_sink_pretrain.py)
GU_SAMPLES, GU_LENGTH = 100, 64
# StreamingLLM's kept initial tokens: none, the first, four (Xiao et al. 2023)
KNOCKOUT_FIRST = (0, 1, 4)
QUANTIZATION_BITS = 8
# Bondarenko et al.'s running min-max over calibration batches (quantization/range_estimators.py)
RANGE_MOMENTUM = 0.9


def batches(sequences, batch_size, device):
    """The sequences (N, T) batch_size at a time, on the device."""
    for start in range(0, len(sequences), batch_size):
        yield sequences[start:start + batch_size].to(device)


def outlier_means(model, sequences, batch_size=1):
    """activation_outliers over the sequences (N, T), batch by batch, each measure averaged over the
    sequences (as validate_clm.py averages its per-sequence values): {key: [one number per
    layer]}."""
    device = next(model.parameters()).device
    parts = [activation_outliers(model, idx) for idx in batches(sequences, batch_size, device)]
    return {key: [torch.cat([part[i][key] for part in parts]).mean().item()
                  for i in range(len(parts[0]))]
            for key in parts[0][0]}


def model_statistics(model, sequences, corner=30, batch_size=1, progress=None):
    """attention_statistics over all sequences (N, T), batch by batch (the weights of a whole 1B
    model at T = 1024 are gigabytes per sequence), reduced to plain numbers: per layer,
    layer_summary's measures, the row sums' median, per-head totals, the corner, alpha's per-head
    means and quantiles, alpha_ma, the sink logits; over the model, Gu et al.'s rates (model_rates)
    and the histogram of per-query row sums over all layers (Figure 3). analyze.py attention's
    numbers.json."""
    device = next(model.parameters()).device
    parts = []
    for idx in batches(sequences, batch_size, device):
        parts.append(attention_statistics(model, idx, corner))
        if progress:
            progress(sum(len(part[0]['first_token']) for part in parts))
    layers, per_head = [], head_stats(model.config)
    for per_batch in zip(*parts):
        s = {key: torch.cat([b[key] for b in per_batch]) if key not in per_head
             else per_batch[0][key] for key in per_batch[0] if per_batch[0][key] is not None}
        layer = layer_summary(s) | dict(row_sum_median=s['row_sums'].median().item(),
                                        head_total=s['head_total'].mean(0).tolist(),
                                        corner=s['corner'].mean(0).tolist())
        if 'alpha' in s:
            alpha = s['alpha'].flatten(0, 1)  # (tokens, H)
            qs = torch.tensor([0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0], dtype=alpha.dtype,
                              device=alpha.device)
            layer.update(alpha_head_mean=alpha.mean(0).tolist(),
                         alpha_quantiles=dict(zip(('min', 'p5', 'p25', 'median', 'p75', 'p95',
                                                   'max'),
                                                  torch.quantile(alpha.flatten(), qs).tolist())))
        layer.update({key: s[key].tolist() for key in per_head if key in s})
        layers.append((layer, s['row_sums'].flatten().cpu().numpy()))
    row_sums = np.concatenate([r for _, r in layers])
    lo, hi = float(row_sums.min()), float(row_sums.max())
    # softmax: every row is 1
    counts, edges = np.histogram(row_sums, bins=50, range=(lo - 1e-3, hi + 1e-3))
    summaries = [layer for layer, _ in layers]
    return dict(layers=summaries, **model_rates(summaries),
                row_sums=dict(mean=float(row_sums.mean()), median=float(np.median(row_sums)),
                              n=len(row_sums),
                              histogram=dict(counts=counts.tolist(), edges=edges.tolist())))


def sink_rates(model, sequences, batch_size=1):
    """Gu et al.'s Sink_1^0.3 in their own setting (sequences: GU_SAMPLES x GU_LENGTH tokens;
    sink_scores): over the model and per layer, on the tokens, on the raw rows and, for a variant
    with a null slot, on the slot."""
    device = next(model.parameters()).device

    def scores(attn, x, cos, sin, positions):
        return sink_scores(attn.weights(x, cos, sin, positions).double(),
                           *weight_rows(model.config))

    parts = [inspect_attention(model, idx, scores)
             for idx in batches(sequences, batch_size, device)]
    rates = {}
    for reading, name in (('tokens', 'sink_rate'), ('null_slot', 'sink_rate_null_slot'),
                          ('raw', 'sink_rate_raw')):
        if parts[0][0][reading] is not None:
            per_layer = [(torch.cat([p[reading]
                                     for p in layer]) > SINK_THRESHOLD).double().mean().item()
                         for layer in zip(*parts)]
            rates |= {name: layer_mean(per_layer), f'{name}_per_layer': per_layer}
    return dict(samples=len(sequences), length=sequences.size(1), **rates)


@torch.no_grad()
def prediction_loss(model, sequences, batch_size=1, first_query=0):
    """Mean cross-entropy of the next-token predictions of queries i >= first_query (targets: token
    i + 1) over the sequences (N, T), in float64 sums: the loss W8A8 and the knockout compare."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with eager_eval(model):
        for idx in batches(sequences, batch_size, device):
            logits, _ = model(idx[:, :-1])
            logits, targets = logits[:, first_query:].double(), idx[:, first_query + 1:]
            total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                     reduction='sum').item()
            count += targets.numel()
    return total / count


def quantize_symmetric(w, bits=QUANTIZATION_BITS):
    """Symmetric per-tensor quantization, then dequantization: step max|w| / (2^(b-1) - 1), integers
    in [-2^(b-1), 2^(b-1) - 1] (quantization/quantizers/uniform_quantizers.py's signed grid)."""
    step = w.abs().max() / (2 ** (bits - 1) - 1)
    return (w / step).round().clamp(-2 ** (bits - 1), 2 ** (bits - 1) - 1) * step


def quantize_asymmetric(x, low, high, bits=QUANTIZATION_BITS):
    """Asymmetric per-tensor quantization, then dequantization, over the range [low, high] widened
    to hold 0 (as uniform_quantizers.py does): step (high - low) / (2^b - 1), zero point round(-low
    / step), integers in [0, 2^b - 1]."""
    low, high = min(low, 0.0), max(high, 1e-8)
    step = (high - low) / (2 ** bits - 1)
    zero = min(max(round(-low / step), 0), 2 ** bits - 1)
    return ((x / step).round() + zero).clamp(0, 2 ** bits - 1).sub(zero) * step


@torch.no_grad()
def quantized_losses(model, calibration, sequences, weight_bits=QUANTIZATION_BITS,
                     act_bits=QUANTIZATION_BITS, batch_size=1):
    """Simulated post-training quantization at weight_bits / act_bits in Bondarenko et al. (2023)'s
    setup, narrowed to the linear layers (docs/analysis.md, "The sink's measures"): every nn.Linear
    but the final one (lm_head, kept in full precision with its input) gets symmetric per-tensor
    weights (quantize_symmetric) and asymmetric per-tensor inputs (quantize_asymmetric) over static
    ranges: the running min-max (momentum 0.9) of each input over the calibration sequences, fixed
    before the evaluation. The model is restored after. Returns the loss (prediction_loss) on the
    sequences in full precision (fp) and quantized, and their ratio."""
    device = next(model.parameters()).device
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not model.lm_head]
    ranges = {}

    def observe(module, args):
        low, high = args[0].min().item(), args[0].max().item()
        if module in ranges:
            old_low, old_high = ranges[module]
            low, high = (RANGE_MOMENTUM * old + (1 - RANGE_MOMENTUM) * new
                         for old, new in ((old_low, low), (old_high, high)))
        ranges[module] = low, high

    def quantize_input(module, args):
        return (quantize_asymmetric(args[0], *ranges[module], bits=act_bits), *args[1:])

    full = prediction_loss(model, sequences, batch_size)
    originals = {m: m.weight.detach().clone() for m in linears}
    hooks = [m.register_forward_pre_hook(observe) for m in linears]
    try:
        with eager_eval(model):
            for idx in batches(calibration, batch_size, device):
                model(idx)
        for hook in hooks:
            hook.remove()
        hooks = [m.register_forward_pre_hook(quantize_input) for m in linears]
        for m in linears:
            m.weight.copy_(quantize_symmetric(m.weight, bits=weight_bits))
        quantized = prediction_loss(model, sequences, batch_size)
    finally:
        for hook in hooks:
            hook.remove()
        for m, weight in originals.items():
            m.weight.copy_(weight)
    return dict(fp=full, quantized=quantized, ratio=quantized / full, calibration=len(calibration))


def w8a8_losses(model, calibration, sequences, batch_size=1):
    """quantized_losses at 8 bits for weights and inputs (W8A8), under the names the records and
    analyze.py read: fp, w8a8, ratio, calibration."""
    q = quantized_losses(model, calibration, sequences, batch_size=batch_size)
    return dict(fp=q['fp'], w8a8=q['quantized'], ratio=q['ratio'], calibration=q['calibration'])


def streaming_hidden(T, window, first, device=None):
    """(T, T) bool, the keys hidden from each query in StreamingLLM's cache (Xiao et al. 2023, arXiv
    2309.17453): query i keeps its last `window` keys (i - window < j <= i) and the first `first`
    positions; the other causal keys hide."""
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(T, device=device)
    return (j <= i - window) & (j >= first)


@torch.no_grad()
def knockout_losses(model, sequences, window=0, first=KNOCKOUT_FIRST, batch_size=1):
    """StreamingLLM's first-token knockout: the loss (prediction_loss) of the queries i >= window
    (those with keys to hide) when each sees only its last `window` keys plus the first k positions,
    for each k in `first`, against full attention on the same predictions. window 0: a quarter of
    the sequences' length. Every layer attends through its explicit weights (Attention.explicit)
    with the hidden keys' scores at -inf, so they leave each variant's own normalisation (affine's
    Eq. 8 included: docs/analysis.md, "The sink's measures"); full attention is the same explicit
    path with nothing hidden. Positions keep their RoPE angles. Returns dict(window, full, first_<k>
    for each k)."""
    T = sequences.size(1)
    window = window or T // 4
    layers = [layer.self_attn for layer in model.model.layers]
    device = next(model.parameters()).device
    losses = dict(window=window)
    try:
        for attn in layers:
            attn.explicit = True
        losses['full'] = prediction_loss(model, sequences, batch_size, window)
        for k in first:
            for attn in layers:
                # the predictions' forward: T - 1 tokens
                attn.hidden_keys = streaming_hidden(T - 1, window, k, device)
            losses[f'first_{k}'] = prediction_loss(model, sequences, batch_size, window)
    finally:
        for attn in layers:
            attn.explicit, attn.hidden_keys = False, None
    return losses
