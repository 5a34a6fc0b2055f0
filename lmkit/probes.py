"""Every measurement of a model's attention and activations on a batch of windows, each defined
once, for train.py's evaluations (evaluation_measures), analyze.py, the sink study and the quick
start's real model. Attention measures read each layer's explicit weights (model.Attention.weights)
on its own inputs in a real forward (lmkit/inspection.py), in float64; rows need not sum to one.
docs/analysis.md, "The sink's measures", has the definitions, their sources and a real model's
numbers; lmkit/sink_costs.py runs them over many sequences and measures what a sink costs."""
import statistics

import torch

from lmkit.inspection import (attention_hooks, head_stats, hooked_forward, mean_attention_logit,
                              variant_tensor_means)

ROWS_SUM_TO_ONE = ('softmax',)  # the variants (keys of model.VARIANTS) whose rows are distributions
NULL_SLOT = ('sink', 'softmax1')  # whose rows leave out a null slot's mass, 1 minus the row's sum
SINK_THRESHOLD = 0.3  # Gu et al.'s epsilon: a head whose first-position score exceeds it has a sink
# added to a row's sum where Gu et al. renormalise it (lit_gpt/inference/model_attn_sim_infer.py)
GU_ROW_EPS = 1e-8
SINK_STUDY_EVALUATIONS = 8  # evaluations per sink study run: the points of its curves
# The value-weighted share reads every 4th query (1, 5, 9, ...): with a gate all queries cost 40%
# of an evaluation; items 1-5 of the measures stay within 10% (tools/bench.py --sections=probes).
VALUE_WEIGHTED_STRIDE = 4
KURTOSIS_EPS = 1e-6  # added to s^4 in Bondarenko et al.'s kurtosis (transformers_language/utils.py)


def variant_statistics(attn, x):
    """What the analyses read of a layer's variant besides its weights, in float64: alpha (B, T, H)
    of Eq. 7 on the input x where it has one, and its per-head tensors (sink logits, alpha_ma)."""
    variant = attn.config.variant
    stats = {'alpha': variant.alpha(attn, x).double()} if variant.alpha else {}
    return stats | {name: getattr(attn, name).double() for name in head_stats(attn.config)}


def weight_rows(config):
    """(whether the variant's rows sum to one, whether they leave out a null slot): sink_scores'."""
    return config.variant_name in ROWS_SUM_TO_ONE, config.variant_name in NULL_SLOT


# The measures, each on a layer's explicit weights w (B, H, T, T), 0 on the keys a query cannot see
def first_token_weights(w):
    """Where each row's attention goes, per query i >= 1 (query 0 sees only token 0), as (B, H, T -
    1) tensors: weight w_i0 (the paper's Figure 4); share w_i0 / sum_j w_ij, where the row's own
    total goes; null 1 - sum_j w_ij, a null slot's mass or what affine's scale took away. The
    paper's Figure 9 reads weight + null. A negative affine w_i0 stays negative in all three."""
    rows = w[:, :, 1:].sum(-1)
    first = w[:, :, 1:, 0]
    return dict(weight=first, share=first / rows, null=1 - rows)


def sink_scores(w, rows_sum_to_one, null_slot):
    """Gu et al.'s first-position score per sample and head (B, H), as sail-sg/Attention-Sink's
    pretrain/eval_sink_pretrain.py computes it: key k scores sum_{i>=k} p_ik / (T - k), query 0's
    own row included, and a head has a sink where the score exceeds SINK_THRESHOLD. 'tokens': p = w
    where rows sum to one, else |w| renormalised, as for their sigmoid and elu models; 'raw': p = w;
    'null_slot': the slot as an extra position 0, as their key bias (None without a slot)."""
    T = w.size(-1)
    first = w[..., 0] if rows_sum_to_one else w[..., 0].abs() / (w.abs().sum(-1) + GU_ROW_EPS)
    tokens = first.sum(-1) / T
    slot = (1 + (1 - w.sum(-1)).sum(-1)) / (T + 1) if null_slot else None
    return dict(tokens=tokens, null_slot=slot, raw=w[..., 0].sum(-1) / T)


def value_weighted_first_token(attn, x, cos, sin, w, stride=1):
    """Kobayashi et al. (2020, arXiv 2004.10102)'s reading of the first token per sample and head
    (B, H): the mean over queries i >= 1 of ||w_i0 f_i(x_0)|| / sum_j ||w_ij f_i(x_j)||, where
    f_i(x_j) = (g_i * v_j) W_O^h, W_O^h is the head's slice of o_proj and g_i the output gate of
    Eq. 4-5 (or 1). A first token that draws weight but adds little shows here. Norms take |w_ij|,
    a null slot adds nothing, a row that adds nothing counts 0; stride > 1 reads queries 1, 1 +
    stride, ... only."""
    config = attn.config
    B, H, D = x.size(0), config.n_head, config.head_dim
    # (B, n_kv_head, T, D): head h reads kv head h // (H / n_kv_head)
    v = attn.project(x, cos, sin)[2].double()
    W = attn.o_proj.weight.double().view(-1, H, D)  # (C, H, D)
    # ||f_i(x_j)||^2 = (g_i v_j)' M (g_i v_j), M = W_O^h' W_O^h (H, D, D)
    gram = torch.einsum('chd,che->hde', W, W)
    w = w[:, :, 1::stride].abs()
    # The elementwise gate scales query i's output channel by channel: a product of (g_i x g_i) M
    # and v_j x v_j over D * D, T^2 D^2 work per head, in float32 (norms to 1e-6) to keep the
    # evaluations cheap. Qiu et al.'s head-wise gate scales a row's every term alike and cancels.
    if config.gate_kind == 'elementwise':
        g = torch.sigmoid(attn.g_proj(x[:, 1::stride]).float())
        g = g.view(B, -1, H, D).transpose(1, 2).contiguous()
        # (B, H, queries, D^2)
        queries = (g.unsqueeze(-1) * g.unsqueeze(-2)).mul_(gram.float()[:, None]).flatten(-2)
        vt = v.float().transpose(-1, -2).contiguous()  # (B, n_kv_head, D, T)
        keys = (vt.unsqueeze(-2) * vt.unsqueeze(-3)).flatten(-3, -2)  # (B, n_kv_head, D^2, T)
        squares = queries.view(B, config.n_kv_head, -1, D * D) @ keys  # a kv head's queries at once
        parts = w * squares.view(w.shape).clamp_min_(0).sqrt_()  # (B, H, queries, T)
        first, total = parts[..., 0], parts.sum(-1)
    else:
        v = v.repeat_interleave(H // config.n_kv_head, dim=1)  # (B, H, T, D)
        norms = torch.einsum('bhjd,hde,bhje->bhj', v, gram, v).clamp_min(0).sqrt()  # (B, H, T)
        first, total = w[..., 0] * norms[..., :1], (w @ norms.unsqueeze(-1)).squeeze(-1)
    return (first / total.clamp_min(torch.finfo(total.dtype).tiny)).mean(-1)


def alpha_summary(alpha):
    """Affine's alpha (Eq. 7) of one layer over every token read, alpha (N, T, H): its mean; its
    standard deviation across queries per head, averaged over heads (0 if the scale ignored the
    input); the shares of alphas exactly at the clip bounds 0 and 1 of Eq. 11."""
    per_head = alpha.flatten(0, 1)
    return dict(alpha_mean=per_head.mean().item(), alpha_std=per_head.std(0).mean().item(),
                alpha_at_0=(per_head == 0).double().mean().item(),
                alpha_at_1=(per_head == 1).double().mean().item())


def max_abs(x):
    """max |x| per sequence of x (B, T, C)."""
    return x.flatten(1).abs().amax(1)


def kurtosis(x):
    """Bondarenko et al.'s kurtosis of each sequence of x (B, T, C), flattened, as
    transformers_language/utils.py computes it: E[(x - mu)^4] / (s^4 + 1e-6), 3 for a Gaussian,
    large with outliers."""
    flat = x.flatten(1)
    squares = (flat - flat.mean(1, keepdim=True)).square()
    variance = squares.sum(1) / (flat.size(1) - 1)  # s^2, unbiased
    return squares.square().mean(1) / (variance.square() + KURTOSIS_EPS)


def activation_outliers(model, idx):
    """Per layer, (B,) float64 tensors on the sequences idx (B, T), with and without position 0:
    Bondarenko et al. (2023, arXiv 2306.12929)'s max |x| and kurtosis of the attention layer's
    output (attention_*) and the FFN's (ffn_*; their OPT's fc2), and max |x| of the residual stream
    after the layer (Sun et al. 2024's massive activations), computed in the forward's hooks."""
    layers = [{} for _ in model.model.layers]
    hooked_forward(model, idx, outlier_hooks(model, layers))
    return layers


def outlier_hooks(model, layers):
    """Forward hooks that put activation_outliers' measures of each layer into its dict."""
    def measure(stats, prefix, kinds):
        def hook(module, args, out):
            out = out.double()
            for suffix, part in (('', out), ('_after_first', out[:, 1:])):
                stats.update({f'{prefix}_{kind}{suffix}': fn(part) for kind, fn in kinds})
        return hook

    both, residual = (('max_abs', max_abs), ('kurtosis', kurtosis)), (('max_abs', max_abs),)
    return [h for layer, stats in zip(model.model.layers, layers)
            for h in (layer.self_attn.register_forward_hook(measure(stats, 'attention', both)),
                      layer.mlp.register_forward_hook(measure(stats, 'ffn', both)),
                      layer.register_forward_hook(measure(stats, 'residual', residual)))]


@torch.no_grad()
def attention_statistics(model, idx, corner=30, value_stride=1):
    """Per-layer statistics of the weights w (B, H, T, T) on the sequences idx (B, T), in float64
    and per sequence so that batches concatenate. Means over queries i >= 1: the measures above,
    negative_rows, row_sums (B, T) (Figure 3), head_total (Figure 5), the entropy of |w|
    renormalised (Figure 6), corner (B, c, c) (Figure 9), variant_statistics and the outliers."""
    def statistics(attn, x, cos, sin, positions):
        rows_sum_to_one, null_slot = weight_rows(attn.config)
        w = attn.weights(x, cos, sin, positions).double()
        rows = w.sum(-1)  # (B, H, T)
        p = w.abs() / w.abs().sum(-1, keepdim=True).clamp_min(1e-30)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # (B, H, T)
        first = first_token_weights(w)
        weight, share, null = first['weight'], first['share'], first['null'].mean(2)
        sink = sink_scores(w, rows_sum_to_one, null_slot)
        stats = dict(first_token=weight.mean(dim=(1, 2)), first_token_head=weight.mean(2),
                     first_token_share=share.mean(dim=(1, 2)), first_token_share_head=share.mean(2),
                     null_mass_head=null, sink_mass=null.mean(1) if null_slot else None,
                     sink_score=sink['tokens'], sink_score_null_slot=sink['null_slot'],
                     negative_rows=(w.amin(-1) < 0).double().mean(dim=(1, 2)),
                     value_weighted_first_head=value_weighted_first_token(attn, x, cos, sin, w,
                                                                          value_stride),
                     row_sums=rows.mean(1), head_total=rows.mean(2),
                     entropy=entropy[:, :, 1:].mean(dim=(1, 2)),
                     corner=w[:, :, :corner, :corner].mean(1))
        return stats | variant_statistics(attn, x)

    layers, outliers = [], [{} for _ in model.model.layers]
    hooked_forward(model, idx, attention_hooks(model, statistics, layers)
                   + outlier_hooks(model, outliers))
    return [layer | stats for layer, stats in zip(layers, outliers)]


# The outlier measures train.py's evaluations and analyze.py keep. The FFN's are read at the end of
# a sink study run (end.payoff), so that records keep the schema the committed ones were checked by.
OUTLIERS = ('attention_max_abs', 'attention_max_abs_after_first', 'attention_kurtosis',
            'attention_kurtosis_after_first', 'residual_max_abs', 'residual_max_abs_after_first')


def layer_summary(s):
    """One layer's measures as plain numbers from attention_statistics' tensors of all sequences:
    means over sequences (per head for a _head key), Gu et al.'s rate of (sequence, head) pairs over
    SINK_THRESHOLD, first_or_null = first_token + null_mass, and alpha_summary's for affine."""
    head = lambda key: s[key].mean(0)
    rate = lambda scores: (scores > SINK_THRESHOLD).double().mean().item()
    out = dict(first_token=s['first_token'].mean().item(),
               first_token_head=head('first_token_head').tolist(),
               first_token_share=s['first_token_share'].mean().item(),
               first_token_share_head=head('first_token_share_head').tolist(),
               null_mass=s['null_mass_head'].mean().item(),
               null_mass_head=head('null_mass_head').tolist(),
               first_or_null=(s['first_token_head'] + s['null_mass_head']).mean().item(),
               first_or_null_head=head('first_token_head').add(head('null_mass_head')).tolist(),
               sink_rate=rate(s['sink_score']),
               negative_rows=s['negative_rows'].mean().item(),
               value_weighted_first=s['value_weighted_first_head'].mean().item(),
               value_weighted_first_head=head('value_weighted_first_head').tolist(),
               entropy=s['entropy'].mean().item(), row_sum_mean=s['row_sums'].mean().item())
    if s.get('sink_score_null_slot') is not None:
        out['sink_rate_null_slot'] = rate(s['sink_score_null_slot'])
    if 'alpha' in s:
        out |= alpha_summary(s['alpha'])
    return out | {key: s[key].mean().item() for key in OUTLIERS}


def model_rates(layers):
    """Gu et al.'s Sink_1 from layer_summary's layers, the mean of the per-layer rates (every layer
    has the same heads and samples), also on a null slot if there is one; and sink_rate_mean_head,
    the share of (layer, head) pairs whose first_token_head exceeds SINK_THRESHOLD."""
    mean = lambda key: layer_mean([layer[key] for layer in layers])
    heads = [w for layer in layers for w in layer['first_token_head']]
    rates = dict(sink_rate=mean('sink_rate'),
                 sink_rate_mean_head=sum(w > SINK_THRESHOLD for w in heads) / len(heads))
    if 'sink_rate_null_slot' in layers[0]:
        rates['sink_rate_null_slot'] = mean('sink_rate_null_slot')
    return rates


# The names train.py's records gave layer_summary's keys first, which sink_record keeps
RECORD_NAMES = dict(first_token='first_token_weight', first_token_head='first_token_per_head',
                    row_sum_mean='row_sum', sink_rate_null_slot='sink_rate_null_slot_per_layer',
                    sink_rate='sink_rate_per_layer', alpha_mean='alpha_window_mean')


def sink_record(model, idx):
    """layer_summary's measures on the windows idx (attention_windows) per layer, and per head for a
    _per_head name, rounded to 6 decimals, the null slot's sink_mass and model_rates, the value-
    weighted share on every VALUE_WEIGHTED_STRIDE-th query. Under FSDP every rank must call it."""
    layers = [layer_summary(layer)
              for layer in attention_statistics(model, idx, value_stride=VALUE_WEIGHTED_STRIDE)]
    rounded = lambda v: round(v, 6) if isinstance(v, float) else [round(h, 6) for h in v]
    per_head = lambda key: key[:-len('_head')] + '_per_head' if key.endswith('_head') else key
    record = {RECORD_NAMES.get(key, per_head(key)): [rounded(layer[key]) for layer in layers]
              for key in layers[0]}
    if weight_rows(model.config)[1]:
        record['sink_mass'] = record['null_mass']
    return record | model_rates(layers)


def evaluation_measures(model, windows, sink, alpha_means):
    """What a train.py evaluation logs of attention: the mean attention logit on the first window
    (Figure 2), the sink's measures on all of them where `sink` (attention_windows > 0), and the
    variant's tensors with this step's mean alpha (Eq. 9). Under FSDP every rank must call it."""
    record = dict(zip(('attn_logit_mean', 'attn_logit_abs_mean'),
                      mean_attention_logit(model, windows[:1])))
    if sink:
        record |= sink_record(model, windows)
    return record | variant_tensor_means(model, alpha_means)


def layer_mean(values):
    """The mean over layers of a per-layer record (sink_record's lists, model_statistics' layers);
    None stays None (a measure a variant does not have, such as sink_mass)."""
    return statistics.fmean(values) if values is not None else None
