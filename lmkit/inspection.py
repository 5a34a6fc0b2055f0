"""
How every measure reads a model's attention: inside a real forward, where each layer gets its own
input (inspect_attention). And the two measures every train.py evaluation logs with it: the mean
attention logit (Figure 2, mean_attention_logit) and the variant's per-head tensors
(variant_tensor_means). lmkit/probes.py builds the sink's measures on it.
"""
from contextlib import contextmanager

import torch

from attention_kernels import attention_scores
from lmkit.distributed import full_tensor

# A variant's per-head tensors, by its key in model.VARIANTS, which train.py logs and the analyses
# plot; a variant without an entry has none.
HEAD_STATS = {'sink': ('sinks',), 'affine': ('alpha_ma',)}


@contextmanager
def eager_eval(model):
    """The model in eval mode (affine's alpha_ma counts nothing) and eager, compiled layers too:
    traced, the hooks the measures add (new at every call) would make dynamo recompile every layer,
    every call."""
    was_training = model.training
    model.eval()
    try:
        with torch.compiler.set_stance('force_eager'):
            yield
    finally:
        model.train(was_training)


@torch.no_grad()
def hooked_forward(model, idx, hooks):
    """An eval-mode, eager forward of idx with the hooks (handles) in place, removed after."""
    try:
        with eager_eval(model):
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()


def attention_hooks(model, fn, results):
    """Pre-hooks that append fn(attention layer, x, cos, sin, positions) to results for every layer,
    x the layer's own attention input, called inside the layer's forward (where FSDP has gathered
    its weights; every rank must run the forward then): how the measures below read the explicit
    attention (Attention.weights) of a real forward."""
    return [layer.self_attn.register_forward_pre_hook(lambda attn,
                                                      args: results.append(fn(attn, *args[:4])))
            for layer in model.model.layers]


def inspect_attention(model, idx, fn):
    """[fn(attention layer, x, cos, sin, positions) for every layer] in an eval-mode forward of idx
    (attention_hooks)."""
    results = []
    hooked_forward(model, idx, attention_hooks(model, fn, results))
    return results


def head_stats(config):
    """The names of the variant's per-head tensors (HEAD_STATS)."""
    return HEAD_STATS.get(config.variant_name, ())


def mean_attention_logit(model, idx):
    """Mean of q_i.k_j/sqrt(d) over layers, heads and causal pairs j <= i (paper Figure 2), and of
    its absolute value, on one sequence: each layer's explicit logits (Attention.weights' scores),
    one layer at a time, inside its forward (inspect_attention). Under FSDP every rank must call
    it."""
    def logits(attn, x, cos, sin, positions):
        scores = attention_scores(*attn.project(x, cos, sin)[:2])
        visible = scores[...,
                         torch.ones(scores.shape[-2:], dtype=torch.bool,
                                    device=scores.device).tril()]
        return torch.stack([visible.mean(), visible.abs().mean()])

    # one transfer
    signed, absolute = zip(*torch.stack(inspect_attention(model, idx[:1], logits)).tolist())
    return sum(signed) / len(signed), sum(absolute) / len(absolute)


def variant_tensor_means(model, alpha_means):
    """Per-layer head means of this step's E[alpha] (affine) and of the variant's per-head tensors
    (HEAD_STATS: affine's alpha_ma, the sink logits), rounded to 5 decimals as train.py logs
    them."""
    layers = [layer.self_attn for layer in model.model.layers]
    stats = {}
    if alpha_means:
        stats['alpha_mean'] = [round(a.mean().item(), 5) for a in alpha_means]
    # a parameter is a shard under FSDP: gathered (every rank calls this)
    for name in head_stats(model.config):
        stats[name] = [round(full_tensor(getattr(m, name)).mean().item(), 5) for m in layers]
    return stats
