"""
GPT.from_pretrained's body, load_model. It lives apart from lmkit/loading.py so that training,
which loads a KD teacher through it, reads only lmkit/checkpoint.py's formats and the network.
"""
import torch

from lmkit.checkpoint import (CheckpointError, checkpoint_file, config_from_hf, model_state,
                              read_checkpoint, read_hf_config, read_safetensors, sliding_window)
from model import BASELINE, GPT, ModelConfig, is_variant_tensor


def load_model(path, attention=BASELINE, dtype=torch.float32, device='cpu', cls=GPT):
    """A model of class cls from a Hugging Face Llama / Mistral / Qwen2 directory (with BASELINE,
    softmax, it gives HF's logits; another variant initialises its own tensors fresh), an export or
    one of this repo's checkpoints (ckpt.pt or its out_dir), each its own variant. Built on the meta
    device, it takes each tensor as it is read (cast to dtype, on device): about 1x its memory."""
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
    if exported and attention not in (BASELINE, config.attention):  # an export is its own variant
        raise ValueError(f"{path}/config.json: an exported {config.attention!r} model cannot be "
                         f"loaded as {attention!r}")
    state = read_safetensors(path, dtype, device, keep_fp32=config.variant.fp32)
    with torch.device('meta'):
        model = cls(config).to(dtype)
    load_hf_state(model, state, path, exported, device)
    if config.block_size == sliding_window(hf):
        model.length_note = (f", the sliding_window of {path}/config.json: this Mistral attends to "
                             f"the last {config.block_size} positions, which is full attention "
                             "only up to that length")
    return model


def load_hf_state(model, state, path, exported, device):
    """Give the meta-device model a Hugging Face directory's tensors. A published model holds only
    softmax's: a variant's own are materialised on device and initialised as a new model's are."""
    config = model.config
    expected = {key for key in model.state_dict() if exported or not is_variant_tensor(key)}
    if config.tie_embeddings:  # lm_head is embed_tokens; HF ignores a stored copy, and so do we
        expected.discard('lm_head.weight')
        state.pop('lm_head.weight', None)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{path}: the tensors do not match its config.json: missing {missing}, "
                         f"unexpected {unexpected}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_embeddings:  # assign=True gave embed_tokens a new Parameter: tie lm_head again
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():  # affine's running alpha sums: never saved, zero at the start
        for key in module._non_persistent_buffers_set:
            module._buffers[key] = torch.zeros_like(module._buffers[key], device=device)
    fresh = set()
    for name, module in model.named_modules():
        own = dict([*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)])
        if any(t.is_meta for t in own.values()):
            fresh |= {f"{name.split('.', 3)[-1]}.{key}" for key in own}  # 'model.layers.N.' dropped
            module.to_empty(device=device, recurse=False)
            model._init_weights(module)
    if fresh:
        print(f"from_pretrained: attention={config.attention!r} is not in {path}: initialised "
              f"fresh in every layer: {', '.join(sorted(fresh))}")
