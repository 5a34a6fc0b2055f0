"""
What train.py checks of a run beyond its keys' ranges: the settings against the data, before any work
(check_sizes; start_notes for what they allow but do not do as written), and the weights and the evaluation's loss
before every save (check_step_finite), so that no checkpoint holds weights that are not finite. Every rank takes part in
check_step_finite and comes to the same verdict. Imports torch, lmkit.distributed and lmkit.errors only.
"""
import math

import torch

from lmkit.distributed import local_tensor, reduce_mean
from lmkit.errors import RunError


def validation_batches(c, val_data):
    """The validation batches an evaluation reads (train.validation_loss): eval_batches, but at most one pass over
    the val split, as more would only read its windows again (start_notes says so)."""
    return min(c['eval_batches'], math.ceil(len(val_data) / c['micro_batch_size']))


def check_sizes(c, train_data, val_data):
    """RunError, before any work, for a setting that asks a split for more windows than it holds: a step's global
    batch (it would read windows more than once, and a batch that size runs out of memory first), or
    attention_windows (there are no more to measure). eval_batches is clamped instead (validation_batches), as the
    default may outgrow a small corpus."""
    where, tokens = f"of data_dir={c['data_dir']}", c['block_size']
    if c['global_batch_size'] > len(train_data):
        raise RunError(f"global_batch_size={c['global_batch_size']:,}: the train split {where} holds "
                       f"{len(train_data):,} windows of {tokens} tokens, and one step would read some of them more "
                       f"than once; give at most {len(train_data):,}, or prepare more data")
    if c['attention_windows'] > len(val_data):
        raise RunError(f"attention_windows={c['attention_windows']:,}: the val split {where} holds {len(val_data):,} "
                       f"windows of {tokens} tokens; give at most {len(val_data):,}")


def start_notes(c, val_data):
    """The lines a run starts with on stderr where its settings do not do what they say: an evaluation that reads
    fewer batches than eval_batches (one pass over a small val split), a warmup that outlasts the run."""
    notes, batches = [], validation_batches(c, val_data)
    if batches < c['eval_batches']:
        notes.append(f"note: eval_batches={c['eval_batches']:,} x micro_batch_size={c['micro_batch_size']} is more "
                     f"than the {len(val_data):,} windows the val split of data_dir={c['data_dir']} holds: each "
                     f"evaluation reads {batches} batch{'es' * (batches > 1)}, every window once")
    if c['warmup_iters'] > c['max_iters']:  # allowed (training.RULES): a short test of a long run's config
        notes.append(f"warning: warmup_iters={c['warmup_iters']} is longer than max_iters={c['max_iters']}: the "
                     f"learning rate never reaches learning_rate={c['learning_rate']:g}, only "
                     f"{c['max_iters'] / c['warmup_iters']:.0%} of it at the last step")
    return notes


def nonfinite_weights(model, device):
    """(names, count): the names of the model's state-dict tensors (what a checkpoint saves) that hold a NaN or an
    infinity, and how many float tensors it has; every rank takes part and gets the same names (under FSDP each
    checks its own shards). One fused pass: a tensor's largest magnitude (torch._foreach_norm, ord=inf) is finite
    exactly when the tensor is, and never overflows as a sum of squares could."""
    named = [(name, local_tensor(t)) for name, t in model.state_dict().items() if t.is_floating_point()]
    bad = torch.zeros(len(named), device=device)
    held = [i for i, (_, t) in enumerate(named) if t.numel()]  # an empty shard has no largest magnitude
    if held:
        norms = torch._foreach_norm([named[i][1] for i in held], math.inf)
        bad[held] = torch.stack([n.float() for n in norms]).isfinite().logical_not().float()
    return [name for (name, _), flag in zip(named, reduce_mean(bad, device)) if flag > 0], len(named)


def check_step_finite(step, record, model, device, ckpt_path, saved):
    """RunError (on every rank alike) where the weights after this step's update, or its evaluation's loss (record:
    the step's), are not finite: the step is then not saved, and out_dir's checkpoints stay those of the last good
    step (saved: its step, None where this run saved none). A finite loss and gradient norm do not prove a finite
    update (a learning rate too large for the weights), hence the weights themselves."""
    bad, count = nonfinite_weights(model, device)
    if bad:
        what = (f"the weights are not finite after the optimizer step: {len(bad)} of the model's {count} float "
                f"tensors hold NaN or infinity, the first {bad[0]}")
    elif not math.isfinite(record.get('val_loss', 0.0)):
        what = f"the validation loss is {record['val_loss']} (the weights are finite)"
    else:
        return
    kept = (f"out_dir's checkpoints are left as they were ({ckpt_path}: step {saved}). To continue from it with a "
            f"lower learning rate: --learning_rate=<lower> --resume_lr_change=True" if saved else
            "this run saved no checkpoint before it; start again with a lower --learning_rate")
    raise RunError(f"step {step}: {what}; stopping without saving: {kept}")
