"""Tests for checkpoint.py and GPT.from_pretrained: exact logits of tiny Hugging Face Llama / Qwen2
checkpoints built here with transformers, every loading error, loading in about 1x the model's
memory; our ckpt.pt written atomically."""
import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MistralConfig, MistralForCausalLM

from lmkit import checkpoint
import distill
from lmkit.checkpoint import config_from_hf
from lmkit.errors import RunError
from lmkit import runs
from model import FIELD_NAMES, GPT, ModelConfig
from hf_helpers import hf_logits, randomise, rel_err

ROOT = Path(__file__).resolve().parents[1]


# -----------------------------------------------------------------------------
# GPT.from_pretrained


@pytest.mark.parametrize('kind', ['llama', 'llama_hub_config', 'qwen2'])
def test_logits_match_hugging_face(kind, hf_dirs):
    path = hf_dirs[kind]
    ours = GPT.from_pretrained(str(path)).eval()
    cfg = ours.config
    idx = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    expected = hf_logits(path, idx)
    with torch.no_grad():
        got = ours(idx)[0]
    err = rel_err(got, expected)
    print(f"{kind}: max |logit diff| / max |logit| = {err:.2e} (max |logit| "
          f"{expected.abs().max():.1f})")
    assert err < 1e-4
    # what the checkpoint is meant to exercise is really there and really matters
    state = ours.state_dict()
    if kind == 'qwen2':
        assert (cfg.qkv_bias and not cfg.tie_embeddings and cfg.rope_theta == 1e6
                and cfg.rms_norm_eps == 1e-6)
        ablated = GPT(dataclasses.replace(cfg, qkv_bias=False)).eval()
        ablated.load_state_dict({k: v for k, v in state.items() if not k.endswith('_proj.bias')})
    else:
        assert len(
            list(
            path.glob('model-*.safetensors'))) > 1 and cfg.n_kv_head == 2 and cfg.tie_embeddings
        assert ours.lm_head.weight is ours.model.embed_tokens.weight
        assert cfg.rope_scaling['rope_type'] == 'llama3' and cfg.rope_scaling['factor'] == 8.0
        ablated = GPT(dataclasses.replace(cfg, rope_scaling=None)).eval()
        ablated.load_state_dict(state)
    with torch.no_grad():
        assert rel_err(ablated(idx)[0], expected) > 1e-3


def test_from_pretrained_dtype_and_teacher_mode(hf_dirs):
    teacher = distill.load_teacher(str(hf_dirs['qwen2']), dtype=torch.bfloat16)
    assert not teacher.training and all(p.dtype == torch.bfloat16 and not p.requires_grad
                                        for p in teacher.parameters())


def edit_checkpoint(src, dst, config=None, tensors=None):
    """A copy of the single-file checkpoint src with config.json and/or its tensors changed."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / 'config.json').read_text())
        config(cfg)
        (dst / 'config.json').write_text(json.dumps(cfg))
    if tensors:
        state = load_file(dst / 'model.safetensors')
        tensors(state)
        save_file(state, dst / 'model.safetensors')
    return dst


BAD_CHECKPOINTS = {  # name: (config edit, tensors edit, error, message)
    # (mistral is supported since issue 14: a qwen2 checkpoint relabelled mistral has biases Mistral
    # does not have)
    'gemma': (lambda c: c.update(model_type='gemma'), None, ValueError, "model_type 'gemma'"),
    'mistral with biases': (lambda c: c.update(model_type='mistral'), None, ValueError,
                            r"unexpected \['model.layers.0.self_attn.k_proj.bias'"),
    'yarn': (lambda c: c.update(rope_parameters=dict(rope_type='yarn', factor=4.0, rope_theta=1e6)),
             None, ValueError, "rope_type 'yarn'"),
    'linear (hub '
    'style)': (lambda c: c.update(rope_parameters=None,
                                  rope_scaling=dict(type='linear', factor=2.0)),
                           None, ValueError, "rope_type 'linear'"),
    'gelu': (lambda c: c.update(hidden_act='gelu'), None, ValueError, "hidden_act"),
    'sliding '
    'window': (lambda c: c.update(use_sliding_window=True), None, ValueError, "use_sliding_window"),
    'head_dim': (lambda c: c.update(head_dim=32), None, ValueError, "head_dim"),
    'missing bias': (None, lambda s: s.pop('model.layers.1.self_attn.k_proj.bias'), ValueError,
                     r"missing \['model.layers.1.self_attn.k_proj.bias'\], unexpected \[\]"),
    'missing lm_head '
    '(untied)': (None, lambda s: s.pop('lm_head.weight'), ValueError, r"missing "
                                                                      r"\['lm_head.weight'\]"),
    'extra '
    'tensor': (None, lambda s: s.update({'model.layers.0.self_attn.extra.weight': torch.zeros(2)}),
                     ValueError, r"unexpected \['model.layers.0.self_attn.extra.weight'\]"),
    'wrong '
    'shape': (lambda c: c.update(intermediate_size=80), None, RuntimeError, "mlp.gate_proj.weight"),
    # the file is deleted below
    'no safetensors': (None, None, FileNotFoundError, "model.safetensors"),
}


@pytest.mark.parametrize('name', BAD_CHECKPOINTS)
def test_from_pretrained_errors(name, hf_dirs, tmp_path):
    edit_config, edit_tensors, error, message = BAD_CHECKPOINTS[name]
    path = edit_checkpoint(hf_dirs['qwen2'], tmp_path / 'ckpt', edit_config, edit_tensors)
    if name == 'no safetensors':
        (path / 'model.safetensors').unlink()
    with pytest.raises(error, match=message):
        GPT.from_pretrained(str(path))
    # the teacher loader turns it into a message, not a traceback
    with pytest.raises(RunError, match=message):
        distill.load_teacher(str(path))


def test_from_pretrained_ignores_rotary_buffers_and_llama_attention_bias_is_refused(hf_dirs,
                                                                                    tmp_path):
    # older HF saves hold these
    inv_freq = {'model.layers.0.self_attn.rotary_emb.inv_freq': torch.ones(8)}
    path = edit_checkpoint(hf_dirs['qwen2'], tmp_path / 'rotary',
                           tensors=lambda s: s.update(inv_freq))
    GPT.from_pretrained(str(path))
    bias = edit_checkpoint(hf_dirs['llama_hub_config'], tmp_path / 'bias',
                           config=lambda c: c.update(attention_bias=True))
    with pytest.raises(ValueError, match='attention_bias'):
        GPT.from_pretrained(str(bias))


def test_mistral_head_dim_null_is_the_default(tmp_path):
    """transformers 4.57 writes "head_dim": null into a Mistral config.json, which means hidden_size
    / num_attention_heads (transformers reads it so): loaded with transformers' logits. A sliding
    window still caps the length, by its own name; a head_dim that differs is refused by name."""
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=None))
    randomise(mistral, 2)
    mistral.save_pretrained(tmp_path / 'mistral', safe_serialization=True)
    path = edit_checkpoint(tmp_path / 'mistral', tmp_path / 'null',
                           config=lambda c: c.update(head_dim=None))
    assert json.loads((path / 'config.json').read_text())['head_dim'] is None
    idx = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_err(GPT.from_pretrained(str(path)).eval()(idx)[0], hf_logits(path, idx)) < 1e-4
    window = edit_checkpoint(path, tmp_path / 'window',
                             config=lambda c: c.update(sliding_window=24))
    assert json.loads((window / 'config.json').read_text())['head_dim'] is None
    windowed = GPT.from_pretrained(str(window))
    assert windowed.config.block_size == 24
    # a longer input is refused by the window's name, not as if 24 were the model's own length
    with pytest.raises(ValueError, match=r"^sequence of 25 tokens is longer than block_size=24, "
                                         r"the sliding_window "
                                         rf"of {re.escape(str(window))}/config\.json: this Mistral "
                                         r"attends to the " rf"last 24 positions"):
        windowed(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^sequence of 129 tokens is longer than block_size=128$"):
        GPT.from_pretrained(str(path))(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(ValueError, match=r"unsupported settings \{'head_dim': 32\}"):
        GPT.from_pretrained(str(edit_checkpoint(path, tmp_path / 'wide',
                                                config=lambda c: c.update(head_dim=32))))


@pytest.mark.parametrize('attention', ['sink', 'affine_gated'])
def test_from_pretrained_other_variants_initialise_their_extras(attention, hf_dirs, capsys):
    softmax = GPT.from_pretrained(str(hf_dirs['llama']))
    model = GPT.from_pretrained(str(hf_dirs['llama']), attention=attention)
    out = capsys.readouterr().out
    extras = {'sink': ['self_attn.sinks'],
              'affine_gated': ['self_attn.alpha_ma', 'self_attn.alpha_proj.weight',
                               'self_attn.g_proj.weight']}[attention]
    assert 'initialised fresh' in out and all(name in out for name in extras)
    state = model.state_dict()
    for key, t in softmax.state_dict().items():  # every checkpoint tensor kept
        assert torch.equal(state[key], t)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for layer in model.model.layers:
        attn = layer.self_attn
        if attention == 'sink':
            assert 0.0 < attn.sinks.std() < 0.1  # normal(0, init_std), not garbage
        else:
            for buffer in (attn.alpha_ma, attn.alpha_sum, attn.alpha_count):
                assert not buffer.is_meta and torch.equal(buffer, torch.zeros_like(buffer))
            assert (0.01 < attn.g_proj.weight.std() < 0.03
                    and 0.01 < attn.alpha_proj.weight.std() < 0.03)
    logits, _ = model(torch.randint(0, 512, (1, 16)))
    assert torch.isfinite(logits).all()


def test_a_checkpoint_with_the_gate_as_a_bool_loads_and_resumes(tmp_path):
    """Before the head-wise gate, ModelConfig.gate was a bool: a checkpoint that records gate=True
    (in its run config and its model_config) loads as the elementwise gate with its own weights,
    and a command that says --gate=True or --gate=elementwise continues it; --gate=headwise is
    another run."""
    argv = ['--attention=sink', '--n_layer=1', '--vocab_size=64']
    c = runs.load_config([*argv, '--gate=elementwise'])
    model = GPT(ModelConfig(**{key: c[key] for key in FIELD_NAMES}))
    meta = dict(tokenizer=dict(sha256='0' * 64), splits=dict(train=dict(tokens=9)))
    ckpt = dict(model=model.state_dict(), tokenizer={}, data=runs.data_fingerprint(meta),
                config=c | dict(gate=True),
                model_config=dataclasses.asdict(model.config) | dict(gate=True))
    checkpoint.save_checkpoint(str(tmp_path / 'ckpt.pt'), ckpt)
    loaded = GPT.from_pretrained(str(tmp_path))
    assert loaded.config.gate == 'elementwise' and loaded.config.gate_kind == 'elementwise'
    idx = torch.randint(0, 64, (1, 9))
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    for gate in ('True', 'elementwise', 'headwise'):
        now = runs.load_config([*argv, f'--gate={gate}'])
        config = ModelConfig(**{key: now[key] for key in FIELD_NAMES})
        if gate == 'headwise':
            with pytest.raises(RunError, match="gate: 'elementwise' -> 'headwise'"):
                runs.check_resumable(ckpt, now, config, meta, 'ckpt.pt')
        else:
            assert runs.check_resumable(ckpt, now, config, meta, 'ckpt.pt') == {}


MEASURE_LOADING = r"""
import re, sys, torch
from model import GPT, ModelConfig
def rss(field):
    return int(re.search(field + r':\s+(\d+)', open('/proc/self/status').read())[1]) * 1024
with torch.device('meta'):
    GPT(ModelConfig())  # the meta device's one-time setup (~70 MB), not part of loading
open('/proc/self/clear_refs', 'w').write('5')  # VmHWM := VmRSS
start = rss('VmRSS')
model = GPT.from_pretrained(sys.argv[1])
sum(float(p.detach().sum()) for p in model.parameters())  # touch every weight
print(rss('VmHWM') - start)
"""


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc/self/status')
def test_from_pretrained_needs_about_one_model_of_memory(tmp_path):
    """A 214 MB float32 checkpoint (written directly, no transformers needed) loads with a peak of
    about 1x its size, every weight touched; building the model first and then copying the weights
    in would need 2x."""
    cfg = dict(model_type='llama', vocab_size=16384, hidden_size=1024, intermediate_size=2048,
               num_hidden_layers=2,
               num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
               rms_norm_eps=1e-5, tie_word_embeddings=False)
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    with torch.device('meta'):
        shapes = {k: v.shape for k,
                  v in GPT(ModelConfig(**config_from_hf(cfg))).state_dict().items()}
    save_file({k: torch.full(shape, 0.01) for k, shape in shapes.items()},
              tmp_path / 'model.safetensors')
    size = (tmp_path / 'model.safetensors').stat().st_size
    run = subprocess.run([sys.executable, '-c', MEASURE_LOADING, str(tmp_path)], cwd=ROOT,
                         capture_output=True,
                         text=True, env=dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072'),
                         check=True)
    peak = int(run.stdout.split()[-1])
    print(f"checkpoint {size / 2**20:.0f} MiB, peak while loading {peak / 2**20:.0f} MiB "
          f"({peak / size:.2f}x)")
    assert 0.9 * size < peak < 1.2 * size

# -----------------------------------------------------------------------------
# Our ckpt.pt


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt.pt')
    checkpoint.save_checkpoint(path, {'step': 1})

    def crash(obj, f):
        f.write(b'half a checkpoint')
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(torch, 'save', crash)
    with pytest.raises(OSError, match='No space left') as error:
        checkpoint.save_checkpoint(path, {'step': 2})
    monkeypatch.undo()
    assert error.value.filename == path  # the write's error names the file it was writing
    assert torch.load(path, weights_only=False) == {'step': 1}
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']  # no temporary file left behind
