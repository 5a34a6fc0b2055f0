"""sample.py: for a checkpoint of every registered variant (affine with both affine_bias_norm
readings), its greedy tokens equal an independent slow reference (the argmax of the model's logits
over the whole window, recomputed without a cache every step), past block_size; it decodes with a KV
cache where the variant allows and recomputes where its outputs depend on the length; the start text
(FILE:, the default, the token the training windows began with, a Hugging Face directory's BOS), the
seed and top_k; every bad-input error line."""
import json
import sys
from dataclasses import asdict

import pytest
import torch

import sample
from export_hf import export_state_dict, write_safetensors
from lmkit.hf_wrapper import hf_config
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from lmkit.errors import run_script
from helpers import HF_LLAMA3_REGEX, hf_tokenizer, save_layout, split_then_bytes
from model import AFFINE_BIAS_NORMS, ATTENTIONS, GPT, ModelConfig

BYTES = load_tokenizer('bytes')
SHAPE = dict(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, intermediate_size=64, block_size=16)
BOS, EOS = '<|begin_of_text|>', '<|end_of_text|>'


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and many times faster than two on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def settings():
    """name -> ModelConfig settings: every registered variant, and again with each other
    affine_bias_norm wherever that changes whether its outputs depend on the length (affine and
    affine_gated with 'visible')."""
    out = {}
    for attention in ATTENTIONS:
        out[attention] = dict(attention=attention)
        for norm in AFFINE_BIAS_NORMS:
            other = dict(attention=attention, affine_bias_norm=norm)
            depends = ModelConfig(attention=attention).outputs_depend_on_length
            if ModelConfig(**other).outputs_depend_on_length != depends:
                out[f'{attention}-{norm}'] = other
    return out


SETTINGS = settings()


def tiny_model(seed, vocab_size=320, **config):
    """A tiny model far from its init (so that the logits of different tokens are far apart), in
    eval mode."""
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**SHAPE, vocab_size=vocab_size, **config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith('alpha_ma'):
                b.uniform_(0.2, 0.8)
    return model


def save_checkpoint(path, model, first_token='stream'):
    """A checkpoint as train.py writes it (the keys sample.py reads), with the byte tokenizer."""
    path.mkdir(parents=True)
    torch.save(dict(model=model.state_dict(), model_config=asdict(model.config),
                    tokenizer=tokenizer_info(BYTES, 'bytes'), config=dict(first_token=first_token)),
               path / 'ckpt.pt')
    return path


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """name -> (checkpoint directory, its model), for every SETTINGS entry; 'prefix': the first
    one's model again, trained (as its run config says) with windows that all begin with the
    end-of-text token."""
    root = tmp_path_factory.mktemp('runs')
    out = {name: (save_checkpoint(root / name, model), model)
           for name,
           model in ((name, tiny_model(i, **s)) for i, (name, s) in enumerate(SETTINGS.items()))}
    first = out[ATTENTIONS[0]][1]
    out['prefix'] = save_checkpoint(root / 'prefix', first, first_token='prefix'), first
    return out


def greedy_reference(model, ids, n):
    """ids and n more tokens, each the argmax of the logits of the last block_size tokens,
    recomputed from scratch."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(torch.tensor([ids[-model.config.block_size:]]))
            ids.append(int(logits[0, -1].argmax()))
    return ids


def run(path, *argv):
    return sample.main([f'--ckpt={path}', '--device=cpu', '--dtype=float32', *argv])


@pytest.mark.parametrize('name', SETTINGS)
def test_greedy_tokens_are_a_full_recomputation(name, runs, monkeypatch, capsys):
    path, model = runs[name]
    prompt = list('Hi there'.encode())
    expected = greedy_reference(model, prompt, 24)  # 8 + 24 tokens: past block_size (16)
    cached = []
    forward = GPT.forward
    monkeypatch.setattr(GPT, 'forward', lambda self, idx, *a,
                        **kw: (cached.append(kw.get('kv_caches') is not None),
                               forward(self, idx, *a, **kw))[1])
    samples = run(path, '--start=Hi '
                        'there', '--temperature=0', '--num_samples=2', '--max_new_tokens=24')
    assert samples == [expected, expected]
    # generate's choice: a KV cache unless the variant's outputs depend on the length
    assert any(cached) != model.config.outputs_depend_on_length and len(cached) == 2 * 24
    out, err = capsys.readouterr()
    assert out == f'{sample.decode(BYTES, expected)}\n---------------\n' * 2
    how = 'recomputing the window' if model.config.outputs_depend_on_length else 'KV cache'
    assert f'attention={model.config.attention}' in err and how in err


def test_start_from_a_file_and_the_defaults(runs, tmp_path):
    path, model = runs[ATTENTIONS[0]]
    text = 'naïve café\nline two'
    (tmp_path / 'prompt.txt').write_text(text, encoding='utf-8')
    greedy = ['--temperature=0', '--num_samples=1', '--max_new_tokens=6']
    expected = greedy_reference(model, list(text.encode()), 6)
    assert run(path, f'--start=FILE:{tmp_path / "prompt.txt"}', *greedy) == [expected]
    assert run(path, f'--start={text}', *greedy) == [expected]
    # nanoGPT's default start, "\n"; a run whose windows all began with a token starts with it, and
    # prints no more
    assert run(path, *greedy) == [greedy_reference(model, [10], 6)]
    prefix_path, _ = runs['prefix']
    assert run(prefix_path, *greedy) == [greedy_reference(model, [BYTES.eot_token], 6)[1:]]
    assert run(prefix_path, '--start=Hi',
               *greedy) == [greedy_reference(model, [BYTES.eot_token, 72, 105], 6)[1:]]


def test_hugging_face_and_export_directories_start_with_the_tokenizers_bos(tmp_path):
    """A Hugging Face directory (a plain Llama: the first variant) and an export of a variant
    transformers does not compute (one whose outputs depend on the length), with a Llama-3-style
    tokenizer that puts its BOS before a text."""
    tok = hf_tokenizer(split_then_bytes(HF_LLAMA3_REGEX), specials=[BOS, EOS], template=f'{BOS} $A')
    vocab = tok.get_vocab_size() + 14
    length_dependent = next(s for s in SETTINGS.values()
                            if ModelConfig(**s).outputs_depend_on_length)
    for i, config in enumerate([dict(attention=ATTENTIONS[0], tie_embeddings=True),
                                length_dependent]):
        model = tiny_model(i, vocab_size=vocab, **config)
        path = save_layout(tmp_path / str(i), tok,
                           tokenizer_config=dict(bos_token=BOS, eos_token=EOS))
        enc = load_tokenizer(str(path))
        (path / 'config.json').write_text(json.dumps(hf_config(model.config, torch.float32, {},
                                                               tokenizer_info(enc, str(path)))))
        write_safetensors(export_state_dict(model, torch.float32), str(path), 1 << 30)
        bos = enc.ids([BOS])
        ids = enc.encode_ordinary('Hello world')
        greedy = ['--temperature=0', '--num_samples=1', '--max_new_tokens=20']
        assert run(path, '--start=Hello '
                         'world', *greedy) == [greedy_reference(model, bos + ids, 20)[1:]]
        # the default start: the BOS alone
        assert run(path, *greedy) == [greedy_reference(model, bos, 20)[1:]]


def test_the_seed_makes_sampling_reproducible(runs, capsys):
    path, model = runs[ATTENTIONS[0]]
    sampled = ['--temperature=1.0', '--top_k=40', '--num_samples=2', '--max_new_tokens=16']
    first = run(path, '--seed=7', *sampled)
    assert run(path, '--seed=7', *sampled) == first and first[0] != first[1]
    assert run(path, '--seed=8', *sampled) != first
    # top_k=1 leaves only the argmax, whatever the temperature
    assert run(path, '--top_k=1', '--temperature=1.0', '--num_samples=1', '--max_new_tokens=8') == [
        greedy_reference(model, [10], 8)]
    capsys.readouterr()


def test_decode_shows_what_the_tokenizer_does_not_know():
    assert sample.decode(BYTES,
                         [72, 105, BYTES.eot_token, 300, 0xE4]) == 'Hi<|endoftext|><|id 300|>\ufffd'


@pytest.mark.parametrize('argv,message', [
    (['--temperature=-1'], '--temperature=-1.0 is out of range: must be in [0, 100]'),
    (['--top_k=0'], '--top_k=0 is out of range: must be >= 1'),
    (['--num_samples=0'], '--num_samples=0 is out of range: must be >= 1'),
    (['--max_new_tokens=0'], '--max_new_tokens=0 is out of range: must be >= 1'),
    (['--seed=-1'], '--seed=-1 is out of range: must be in [0, 18446744073709551615]'),
    (['--temperature=hot'], "--temperature=hot: temperature='hot' has type str, expected float "
                            "(invalid float value: 'hot')"),
    (['--dtype=float8'], "--dtype=float8: invalid choice: dtype='float8'; valid values: auto, "
                         "float32, bfloat16, float16"),
    (['--temp=0'], "unrecognized arguments: --temp=0 (unknown config key 'temp'); valid keys: "
                   "--ckpt, --device, --dtype, --max_new_tokens, --num_samples, --seed, --start, "
                   "--temperature, --tokenizer, --top_k"),
])
def test_bad_flags_stop_before_any_work_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(GPT, 'from_pretrained', None)  # nothing may be loaded
    with pytest.raises(SystemExit) as e:
        sample.main(['--ckpt=anywhere', *argv])
    err = capsys.readouterr().err
    assert (e.value.code == 2 and err.startswith('usage: sample.py')
            and err.splitlines()[1:] == [f'error: {message}'])


def test_the_checkpoint_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        sample.main([])
    assert (e.value.code == 2
            and capsys.readouterr().err.endswith('error: the following arguments are required: '
                                                 '--ckpt\n'))


def test_bad_inputs_are_one_line_errors(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['sample.py'])
    path, _ = runs[ATTENTIONS[0]]
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'latin1.txt').write_bytes(b'caf\xe9')
    for argv, message in [
        ([f'--ckpt={tmp_path / "nowhere"}'],
         f'model {tmp_path / "nowhere"}: {tmp_path / "nowhere"}: no such file or directory'),
        ([f'--ckpt={tmp_path / "empty"}'],
         f'model {tmp_path / "empty"}: {tmp_path / "empty"}: a directory with neither config.json'),
        ([f'--ckpt={path}', f'--start=FILE:{tmp_path / "missing.txt"}'],
         f'--start=FILE:{tmp_path / "missing.txt"}: cannot read {tmp_path / "missing.txt"}: No '
         'such file or directory'),
        ([f'--ckpt={path}', f'--start=FILE:{tmp_path / "latin1.txt"}'],
         f'--start=FILE:{tmp_path / "latin1.txt"}: {tmp_path / "latin1.txt"} is not UTF-8 text'),
        ([f'--ckpt={path}', '--start='],
         "--start=: an empty prompt, and this model has no start token to begin with; give some "
         "text"),
        ([f'--ckpt={path}', '--device=gpu'], '--device=gpu: not a device name'),
    ]:
        with pytest.raises(SystemExit) as e:
            run_script(sample.main, argv)
        out, err = capsys.readouterr()
        assert e.value.code == 1 and out == '' and err.startswith(
            f'sample.py: error: {message}') and \
            err.count('\n') == 1, err


@pytest.mark.parametrize('gate,shown', [
    ('none', 'attention=sink, '), ('elementwise', 'attention=sink with the elementwise gate, '),
    ('headwise', 'attention=sink with the headwise gate, ')])
def test_the_first_line_names_the_gate(gate, shown, tmp_path, capsys):
    """Which gate the gate flag put on the variant, as the flag names it (--gate=headwise)."""
    path = save_checkpoint(tmp_path / gate, tiny_model(0, attention='sink', gate=gate))
    run(path, '--num_samples=1', '--max_new_tokens=1')
    assert f'sample.py: {path}: {shown}2 layers' in capsys.readouterr().err
