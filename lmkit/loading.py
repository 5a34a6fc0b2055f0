"""
The one home of loading a model. load_model builds a GPT from our checkpoint, an export or a
Hugging Face directory; GPT.from_pretrained calls it (and distill.load_teacher loads the KD teacher
through that, frozen, in eval mode). load_model_and_tokenizer gives a model with the tokenizer it
was trained with, checked by its sha256, and window_first_token the token its training windows
started with. Every script loads through it.
"""
import os
import sys

import torch

from lmkit.checkpoint import (CheckpointError, checkpoint_file, config_from_hf, model_state,
                              read_checkpoint, read_hf_config, read_safetensors, sliding_window)
from lmkit.data import first_token_id
from lmkit.errors import RunError
from lmkit.runs import recorded_config, run_config
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from model import BASELINE, GPT, ModelConfig, is_variant_tensor


def check_finished(spec, allowed, flag):
    """A RunError where spec is one of our checkpoints whose run stopped before its max_iters (a
    stopped train.py saves the step it reached, and exits non-zero: a chain that goes on anyway
    would score or ship a part-trained model as the run's), unless `allowed` (`flag` said so); then
    a note on stderr. A Hugging Face directory, an export or a model saved alone records no
    max_iters: nothing is said."""
    path = checkpoint_file(spec)
    ckpt = read_checkpoint(path, keys=()) if path else {}
    config = ckpt.get('config') or {}
    if 'max_iters' in recorded_config(config)[1]:  # no run: a model saved alone, or no checkpoint
        return
    step, max_iters = ckpt['step'], run_config(config).max_iters
    if step >= max_iters:
        return
    unfinished = (f"{path} holds step {step:,} of its run's max_iters={max_iters:,}: the run has "
                  "not finished")
    if not allowed:
        raise RunError(f"{unfinished}; continue it with the train.py command that started it (it "
                       f"continues from this checkpoint), or pass {flag} to use it as it is")
    print(f"note: {unfinished}; used as it is ({flag})", file=sys.stderr)


def window_first_token(spec):
    """The token a checkpoint's training windows all started with (train.py's first_token='prefix'),
    which every reader puts first too: None for a Hugging Face directory or a run with the default
    windows."""
    path = checkpoint_file(spec)
    if path is None:
        return None
    ckpt = read_checkpoint(path, keys=('tokenizer',))
    # (a checkpoint of a model alone has no config: the defaults)
    config = run_config(ckpt.get('config', {}))
    return first_token_id(config.first_token, ckpt['tokenizer'])


def load_model_and_tokenizer(spec, tokenizer, device, dtype):
    """(model, tokenizer) of a checkpoint spec: a Hugging Face directory's own tokenizer files, or
    the tokenizer recorded in one of our checkpoints, rebuilt from its spec (or from `tokenizer`,
    where it is now) and checked by its sha256 to be the one the model was trained with."""
    try:
        model = GPT.from_pretrained(spec, dtype=dtype, device=device).eval()
    except (OSError, ValueError, RuntimeError) as e:  # unreadable, unsupported, does not fit
        raise RunError(f"model {spec}: {e}") from e
    path = checkpoint_file(spec)
    if path is None:
        return model, load_tokenizer(tokenizer or spec)
    info = read_checkpoint(path)['tokenizer']
    tok_spec = tokenizer or info['spec']
    if tok_spec != 'bytes' and not os.path.exists(tok_spec):
        raise RunError(f"{path}: its tokenizer {tok_spec} is gone; pass --tokenizer=<where it is "
                       "now>")
    enc = load_tokenizer(tok_spec)
    if tokenizer_info(enc, tok_spec)['sha256'] != info['sha256']:
        # a record without 'boundary' predates reading tokenizers from their own files: if the files
        # are unchanged, the data was tokenized with conventions guessed from config.json that
        # differ from the files'
        older = '' if 'boundary' in info else (
            f"; it was recorded by an older prepare_data.py, which inferred the {info['family']} "
            f"conventions from config.json where this one reads {enc.name} ones from the "
            "tokenizer's files: if those files are the same, prepare the data again and retrain")
        raise RunError(f"{path}: the tokenizer at {tok_spec} is not the one the model was trained "
                       f"with (sha256 {info['sha256'][:12]}...); pass --tokenizer=<the right "
                       f"one>{older}")
    return model, enc


def load_model(path, attention=BASELINE, dtype=torch.float32, device='cpu', cls=GPT):
    """GPT.from_pretrained: a model of class cls (model.GPT) from a Hugging Face Llama / Mistral /
    Qwen2 directory (with attention=model.BASELINE, softmax, model(idx) gives HF's logits; another
    variant keeps every tensor and initialises its own, sinks, g_proj or alpha_proj, fresh), a
    directory export_hf.py wrote, or one of this repo's checkpoints (ckpt.pt, or the out_dir holding
    it); the last two are the variant they hold. The model is built on the meta device and takes the
    tensors as they are read (cast to dtype, on device): about 1x the model's size in memory."""
    ckpt_path = checkpoint_file(path)
    if ckpt_path is not None:  # ours: every tensor of its own variant
        ckpt = read_checkpoint(ckpt_path)
        config = ModelConfig(**ckpt['model_config'])
        if attention not in (BASELINE, config.attention):
            raise ValueError(f"{ckpt_path}: a {config.attention!r} model cannot be loaded as "
                             f"{attention!r}")
        model = cls(config)
        try:
            model.load_state_dict(model_state(ckpt))
        except RuntimeError as e:  # torch's message spans lines: one line of it
            raise CheckpointError(f"{ckpt_path} is not a readable checkpoint of train.py: its "
                                  "tensors do not fit its model_config "
                                  f"({' '.join(str(e).split())})") from None
        return model.to(device=device, dtype=dtype)
    hf = read_hf_config(path)
    exported = 'model_config' in hf
    config = ModelConfig(**config_from_hf(hf) | ({} if exported else dict(attention=attention)))
    # an export is always its own variant
    if exported and attention not in (BASELINE, config.attention):
        raise ValueError(f"{path}/config.json: an exported {config.attention!r} model cannot be "
                         f"loaded as {attention!r}")
    state = read_safetensors(path, dtype, device, keep_fp32=config.variant.fp32)
    with torch.device('meta'):
        model = cls(config).to(dtype)
    # what the directory holds: every tensor of an exported variant, the softmax ones of a published
    # model
    expected = {key for key in model.state_dict() if exported or not is_variant_tensor(key)}
    if config.tie_embeddings:  # lm_head is embed_tokens; HF ignores a stored copy, and so do we
        expected.discard('lm_head.weight')
        state.pop('lm_head.weight', None)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{path}: the tensors do not match its config.json: missing {missing}, "
                         f"unexpected {unexpected}")
    model.load_state_dict(state, strict=False, assign=True)
    # assign=True gave embed_tokens a new Parameter: tie lm_head to it again
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():  # affine's running alpha sums: never saved, zero at the start
        for key in module._non_persistent_buffers_set:
            module._buffers[key] = torch.zeros_like(module._buffers[key], device=device)
    # what is still on meta is a published model's missing variant tensors: materialised and
    # initialised
    fresh = set()
    for name, module in model.named_modules():
        own = dict(
            module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
        if any(t.is_meta for t in own.values()):
            fresh |= {f"{name.split('.', 3)[-1]}.{key}" for key in own}  # 'model.layers.N.' dropped
            module.to_empty(device=device, recurse=False)
            model._init_weights(module)
    if fresh:
        print(f"from_pretrained: attention={attention!r} is not in {path}: initialised fresh in "
              f"every layer: {', '.join(sorted(fresh))}")
    if config.block_size == sliding_window(hf):
        model.length_note = (f", the sliding_window of {path}/config.json: this Mistral attends to "
                             f"the last {config.block_size} positions, which is full attention "
                             "only up to that length")
    return model
