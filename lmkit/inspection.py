"""How every measure reads a model's attention: inside a real forward, where each layer gets its own
input (inspect_attention). Also the two measures every train.py evaluation logs with it: the mean
attention logit (Figure 2) and the variant's per-head tensors. lmkit/probes.py builds on it."""
from contextlib import contextmanager

import torch

from attention_kernels import attention_scores
from lmkit.distributed import full_tensor

# The per-head tensors train.py logs, by the variant's key in model.VARIANTS (none without an entry)
HEAD_STATS = {'sink': ('sinks',), 'affine': ('alpha_ma',)}


@contextmanager
def eager_eval(model):
    """The model in eval mode (affine's alpha_ma counts nothing) and eager, compiled layers too: the
    measures' hooks, new at every call, would make dynamo recompile every layer at every call."""
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
    x the layer's own input. They run inside the layer's forward, where FSDP has gathered its
    weights, so every rank must run the forward."""
    hook = lambda attn, args: results.append(fn(attn, *args[:4]))
    return [layer.self_attn.register_forward_pre_hook(hook) for layer in model.model.layers]


def inspect_attention(model, idx, fn):
    """[fn(attention layer, x, cos, sin, positions) for every layer] in a forward of idx."""
    results = []
    hooked_forward(model, idx, attention_hooks(model, fn, results))
    return results


def head_stats(config):
    """The names of the variant's per-head tensors (HEAD_STATS)."""
    return HEAD_STATS.get(config.variant_name, ())


def mean_attention_logit(model, idx):
    """Mean of q_i.k_j/sqrt(d) over layers, heads and causal pairs j <= i (Figure 2), and of its
    absolute value, on one sequence. Under FSDP every rank must call it."""
    def logits(attn, x, cos, sin, positions):
        scores = attention_scores(*attn.project(x, cos, sin)[:2])
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        visible = scores[..., causal]
        return torch.stack([visible.mean(), visible.abs().mean()])

    # one transfer
    signed, absolute = zip(*torch.stack(inspect_attention(model, idx[:1], logits)).tolist())
    return sum(signed) / len(signed), sum(absolute) / len(absolute)


def variant_tensor_means(model, alpha_means):
    """Per-layer head means of this step's E[alpha] (affine) and of the variant's per-head tensors,
    rounded to 5 decimals as train.py logs them."""
    stats = {'alpha_mean': [round(a.mean().item(), 5) for a in alpha_means]} if alpha_means else {}
    # a parameter is a shard under FSDP: gathered (every rank calls this)
    layers = [layer.self_attn for layer in model.model.layers]
    return stats | {name: [round(full_tensor(getattr(m, name)).mean().item(), 5) for m in layers]
                    for name in head_stats(model.config)}
