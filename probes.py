"""
Every measurement of a model's attention and activations, each defined once: what train.py's evaluations log,
analyze.py's figures and numbers, sink_study.py's results and the quick start's real-model table all read.

Each measure reads a layer as the model's own forward gives it (inspect_attention) through the layer's explicit
weights (model.Attention.weights, the T x T form of every variant), in float64. The formulas, their sources and how
they treat rows that do not sum to one (affine, and the null slot of sink and softmax1) are in the docstrings below
and in docs/analysis.md.
"""
import statistics

import numpy as np
import torch

from attention_kernels import attention_scores
from common import full_tensor
from model import HEAD_STATS

SINK_THRESHOLD = 0.3  # Gu et al. (2025)'s epsilon: a head whose mean first-token weight exceeds it has a sink
SINK_STUDY_EVALUATIONS = 8  # evaluations per sink study run (its curves' points): sink_study.py's runs, bench.py's


@torch.no_grad()
def inspect_attention(model, idx, fn):
    """[fn(attention layer, x, cos, sin, positions) for every layer], x each layer's own attention input in an
    eval-mode forward of idx (so affine's alpha_ma counts nothing), called inside the layer's forward (where FSDP
    has gathered its weights; every rank must call it then): how the measures below read the explicit attention
    (Attention.weights) of a real forward. The forward runs eagerly, compiled layers too: traced, the hooks (new at
    every call) and their growing list of results would make dynamo recompile every layer, every call."""
    results = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda attn, args: results.append(fn(attn, *args[:4])))
             for layer in model.model.layers]
    was_training = model.training
    model.eval()
    try:
        with torch.compiler.set_stance('force_eager'):
            model(idx)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return results


def variant_statistics(attn, x):
    """What the analyses read of a layer's variant besides its weights, in float64: alpha (B, T, H) of Eq. 7 on the
    input x where it has one, and its per-head tensors (Variant.head_stats: sink logits, alpha_ma)."""
    variant = attn.config.variant
    stats = {'alpha': variant.alpha(attn, x).double()} if variant.alpha else {}
    return stats | {name: getattr(attn, name).double() for name in variant.head_stats}


@torch.no_grad()
def attention_statistics(model, idx, corner=30):
    """Per-layer statistics of the effective attention weights on the sequences idx (B, T), T <= block_size, each
    per sequence so that batches concatenate (torch.cat along dim 0) into the statistics of all sequences:
    what analyze.py's figures, train.py's evaluations and sink_study.py read. Weights come from each layer's
    Attention.weights on the inputs the model's own forward gives that layer (inspect_attention), in float64.
    For weights w (B, H, T, T):
      first_token (B,):    w[:, :, i, 0] averaged over heads and queries i >= 1 (query 0 sees only token 0):
                           Figure 4's measure;
      first_token_head (B, H): the same per head (Gu et al.'s sink metric counts heads whose mean is > 0.3);
      first_token_share (B,): w[:, :, i, 0] / sum_j w_ij, averaged likewise: where a row puts its weight, for
                           variants whose rows do not sum to one (affine, and the sinks');
      sink_mass (B,) or None: the weight on a learned sink (Variant.sink: 1 - the row's sum), averaged likewise;
      row_sums (B, T):     sum_j w_ij per query, averaged over heads (Figure 3's histogram; sink: the real tokens
                           only, so softmax's rows give exactly 1 and sink's 1 - the sink's weight);
      head_total (B, H):   per head, the mean row sum (Figure 5);
      entropy (B,):        -sum_j p_ij log p_ij with p_ij = |w_ij| / sum_j |w_ij|, averaged over heads and queries
                           i >= 1. Affine weights can be negative and rows need not sum to 1, so this is the
                           entropy of the distribution of attention *magnitude* over the visible keys; for
                           softmax the usual entropy, for sink that of the weights renormalised without the
                           sink's mass (Figure 6);
      corner (B, c, c):    the head-averaged top-left corner x corner block (Figure 9);
      and the variant's own (variant_statistics): alpha (B, T, H), affine's scale per token and head (Eq. 7);
      its per-head tensors (H,) (HEAD_STATS: affine's alpha_ma, the sink logits)."""
    def statistics(attn, x, cos, sin, positions):
        w = attn.weights(x, cos, sin, positions).double()
        rows = w.sum(-1)  # (B, H, T)
        p = w.abs() / w.abs().sum(-1, keepdim=True).clamp_min(1e-30)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # (B, H, T)
        first = w[:, :, 1:, 0]
        stats = dict(first_token=first.mean(dim=(1, 2)), first_token_head=first.mean(2),
                     first_token_share=(first / rows[:, :, 1:]).mean(dim=(1, 2)),
                     sink_mass=(1 - rows[:, :, 1:]).mean(dim=(1, 2)) if attn.config.variant.sink else None,
                     row_sums=rows.mean(1), head_total=rows.mean(2), entropy=entropy[:, :, 1:].mean(dim=(1, 2)),
                     corner=w[:, :, :corner, :corner].mean(1))
        return stats | variant_statistics(attn, x)

    return inspect_attention(model, idx, statistics)


def mean_attention_logit(model, idx):
    """Mean of q_i.k_j/sqrt(d) over layers, heads and causal pairs j <= i (paper Figure 2), and of its absolute value,
    on one sequence: each layer's explicit logits (Attention.weights' scores), one layer at a time, inside its
    forward (inspect_attention). Under FSDP every rank must call it."""
    def logits(attn, x, cos, sin, positions):
        scores = attention_scores(*attn.project(x, cos, sin)[:2])
        visible = scores[..., torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()]
        return torch.stack([visible.mean(), visible.abs().mean()])

    signed, absolute = zip(*torch.stack(inspect_attention(model, idx[:1], logits)).tolist())  # one transfer
    return sum(signed) / len(signed), sum(absolute) / len(absolute)


def variant_tensor_means(model, alpha_means):
    """Per-layer head means of this step's E[alpha] (affine) and of the variant's per-head tensors (Variant.head_stats:
    affine's alpha_ma, the sink logits), rounded to 5 decimals as train.py logs them."""
    layers = [layer.self_attn for layer in model.model.layers]
    stats = {}
    if alpha_means:
        stats['alpha_mean'] = [round(a.mean().item(), 5) for a in alpha_means]
    for name in model.config.variant.head_stats:  # a parameter is a shard under FSDP: gathered (every rank calls this)
        stats[name] = [round(full_tensor(getattr(m, name)).mean().item(), 5) for m in layers]
    return stats


def sink_record(model, idx):
    """What the attention puts on the first token, per layer, on the windows idx (attention_statistics, in float64;
    train.py's attention_windows): the first-token weight (Figure 4), its share of each row, a learned sink's own
    mass, the per-head weights and Sink_1^0.3, the share of all heads above SINK_THRESHOLD (Gu et al. 2025,
    Section 3), the entropy (Figure 6) and the mean row sum (Figure 3). Under FSDP every rank must call it."""
    layers = attention_statistics(model, idx)
    per_head = [layer['first_token_head'].mean(0).tolist() for layer in layers]
    heads = [w for layer in per_head for w in layer]

    def mean(key):
        return [round(layer[key].mean().item(), 6) for layer in layers]

    record = dict(first_token_weight=mean('first_token'), first_token_share=mean('first_token_share'),
                  first_token_per_head=[[round(w, 6) for w in layer] for layer in per_head],
                  sink_rate=sum(w > SINK_THRESHOLD for w in heads) / len(heads), entropy=mean('entropy'),
                  row_sum=mean('row_sums'))
    if layers[0]['sink_mass'] is not None:
        record['sink_mass'] = mean('sink_mass')
    return record


def layer_mean(values):
    """The mean over layers of a per-layer record (sink_record's lists, model_statistics' layers); None stays None
    (a measure a variant does not have, such as sink_mass)."""
    return statistics.fmean(values) if values is not None else None


def first_token_weight(record):
    """A run's first-token weight (sink_record's, Figure 4's measure), averaged over layers."""
    return layer_mean(record['first_token_weight'])


def first_token_share(record):
    """A run's first-token share of each row (sink_record's), averaged over layers."""
    return layer_mean(record['first_token_share'])


def model_statistics(model, sequences, corner=30, batch_size=1, progress=None):
    """attention_statistics over all sequences (N, T), batch by batch (the weights of a whole 1B model at T = 1024
    are gigabytes per sequence), reduced to plain numbers: per layer, means over sequences, the row sums' mean and
    median, per-head totals, the corner, alpha's per-head means, quantiles and alpha_ma, the sink logits; and,
    over all layers, the histogram of per-query row sums (Figure 3). analyze.py attention's numbers.json."""
    device = next(model.parameters()).device
    parts = []
    for start in range(0, len(sequences), batch_size):
        parts.append(attention_statistics(model, sequences[start:start + batch_size].to(device), corner))
        if progress:
            progress(min(start + batch_size, len(sequences)))
    layers = []
    for per_batch in zip(*parts):
        s = {key: torch.cat([b[key] for b in per_batch]) if key not in HEAD_STATS else per_batch[0][key]
             for key in per_batch[0] if per_batch[0][key] is not None}
        layer = dict(first_token=s['first_token'].mean().item(), entropy=s['entropy'].mean().item(),
                     row_sum_mean=s['row_sums'].mean().item(), row_sum_median=s['row_sums'].median().item(),
                     head_total=s['head_total'].mean(0).tolist(), corner=s['corner'].mean(0).tolist())
        if 'alpha' in s:
            alpha = s['alpha'].flatten(0, 1)  # (tokens, H)
            qs = torch.tensor([0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0], dtype=alpha.dtype, device=alpha.device)
            layer.update(alpha_head_mean=alpha.mean(0).tolist(),
                         alpha_quantiles=dict(zip(('min', 'p5', 'p25', 'median', 'p75', 'p95', 'max'),
                                                  torch.quantile(alpha.flatten(), qs).tolist())))
        layer.update({key: s[key].tolist() for key in HEAD_STATS if key in s})
        layers.append((layer, s['row_sums'].flatten().cpu().numpy()))
    row_sums = np.concatenate([r for _, r in layers])
    lo, hi = float(row_sums.min()), float(row_sums.max())
    counts, edges = np.histogram(row_sums, bins=50, range=(lo - 1e-3, hi + 1e-3))  # softmax: every row is 1
    return dict(layers=[layer for layer, _ in layers],
                row_sums=dict(mean=float(row_sums.mean()), median=float(np.median(row_sums)), n=len(row_sums),
                              histogram=dict(counts=counts.tolist(), edges=edges.tolist())))
