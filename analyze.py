"""
The paper's analyses (Section 4, Appendix A-B) as functions over a model and over training metrics.
This file holds the statistics; the command that turns runs into figures and report.md is not written yet.

From a model (explicit weights of Attention.weights, never the training path), per layer:
    first-token weight (Figure 4), per-query row sums (Figure 3), per-head total weight (Figure 5),
    entropy (Figure 6), a head-averaged corner of the matrix (Figure 9), alpha / alpha_ma / sinks.
From metrics.jsonl: gradient-norm statistics and spike counts (Tables 4-5).
"""
import math

import numpy as np
import torch

from model import rope_cos_sin


@torch.no_grad()
def attention_statistics(model, idx, corner=30):
    """Per-layer statistics of the effective attention weights on the sequences idx (B, T), B*T <= the model's
    block_size each. Weights come from each layer's Attention.weights on the inputs the model's own forward
    gives that layer (eval mode, so affine's alpha_ma is untouched). Definitions, for weights w (B, H, T, T):
      first_token: w[:, :, i, 0] averaged over heads, sequences and queries i >= 1 (query 0 sees only token 0);
      row_sums:    sum_j w_ij per query, averaged over heads (every query of every sequence; Figure 3's histogram);
      head_total:  per head, the mean row sum (Figure 5; normalise for display);
      entropy:     -sum_j p_ij log p_ij with p_ij = |w_ij| / sum_j |w_ij|, averaged over heads, sequences and
                   queries i >= 1. Affine weights can be negative and rows need not sum to 1, so the entropy is
                   that of the distribution of attention *magnitude* over the visible keys; for softmax it is
                   the usual entropy, for sink that of the weights renormalised without the sink's mass;
      corner:      the head-averaged top-left corner x corner block of sequence 0 (Figure 9)."""
    layers = [layer.self_attn for layer in model.model.layers]
    inputs = []
    hooks = [a.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for a in layers]
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    T = idx.size(1)
    positions = torch.arange(T, device=idx.device)
    cos, sin = rope_cos_sin(model.config, positions)
    stats = []
    for attn, x in zip(layers, inputs):
        w = attn.weights(x, cos, sin, positions).double()
        p = w.abs() / w.abs().sum(-1, keepdim=True).clamp_min(1e-30)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # (B, H, T)
        stats.append(dict(
            first_token=w[:, :, 1:, 0].mean().item(),
            row_sums=w.sum(-1).mean(1).flatten().tolist(),
            head_total=w.sum(-1).mean(dim=(0, 2)).tolist(),
            entropy=entropy[:, :, 1:].mean().item(),
            corner=w[0, :, :corner, :corner].mean(0).tolist(),
        ))
        if hasattr(attn, 'alpha_ma'):
            stats[-1]['alpha'] = attn.scale(x).mean(dim=(0, 1)).tolist()  # per head, mean over tokens
            stats[-1]['alpha_ma'] = attn.alpha_ma.tolist()
        if hasattr(attn, 'sinks'):
            stats[-1]['sinks'] = attn.sinks.tolist()
    return stats


def grad_norm_statistics(grad_norms, start=0, end=500):
    """Table 4 over steps [start, end) of the raw (unclipped) gradient norms: mean, standard deviation and
    variance (population, ddof = 0) and the coefficient of variation std / mean."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    mean, std = g.mean(), g.std()
    return dict(mean=mean, std=std, variance=std ** 2, cv=std / mean if mean else math.nan)


def spike_counts(grad_norms, ks=(6, 9), start=0, end=500):
    """Table 5: the number of steps in [start, end) whose gradient norm exceeds median(g) + k * MAD(g), with
    MAD(g) = median(|g - median(g)|), the raw median absolute deviation (no 1.4826 normal-consistency factor;
    the paper does not give one)."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    median = np.median(g)
    mad = np.median(np.abs(g - median))
    return {k: int((g > median + k * mad).sum()) for k in ks}
