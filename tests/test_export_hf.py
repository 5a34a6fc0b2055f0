"""Tests for export_hf.py: tiny models of every variant, exported and loaded back through
transformers (the reference for Hugging Face loading): their logits against ours, unpadded and in
right-padded batches (affine's N), generate(); the files (weights key for key, model.py shipped as
it is, configs); the exported tokenizer's ids against ours (bytes and a Llama-3-style BPE trained
here, saved by transformers 5); the round trip through GPT.from_pretrained, a KD teacher and
eval_zeroshot's loaders; the harness's scoring path (lm-evaluation-harness's HFLM at batch size 1);
transformers 4.x when an interpreter with it is at $TRANSFORMERS4_PYTHON (default
/tmp/tf4/bin/python, else skipped); bad input."""
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import distill
from lmkit import loading
from lmkit import zeroshot as ez
import export_hf
import prepare_data as prep
from lmkit.tokenizer import gpt2_unicode_to_byte, load_tokenizer, tokenizer_info
from lmkit.errors import RunError
from model import ATTENTIONS, GPT, ModelConfig
from helpers import HF_LLAMA3_REGEX, TEXT, train_hf_bpe, write_tiktoken_file
from hf_helpers import randomise

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]
TRANSFORMERS4_PYTHON = os.environ.get('TRANSFORMERS4_PYTHON', '/tmp/tf4/bin/python')
LLAMA3_ROPE = dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
# name -> (ModelConfig settings, tokenizer): every variant, both transformers architectures a
# softmax student becomes, biases, tied and untied heads, Llama-3 rope scaling, both affine
# activations, a sharded export, both tokenizers, each gate on a variant the paper has without it
# (the elementwise one as the bool it once was); then every other variant model.py has, as it comes
VARIANTS = {
    'softmax': (dict(attention='softmax', rope_scaling=LLAMA3_ROPE), 'hf'),  # -> LlamaForCausalLM
    # -> Qwen2ForCausalLM
    'softmax_qwen2': (dict(attention='softmax', qkv_bias=True, tie_embeddings=False), 'bytes'),
    'sink': (dict(attention='sink'), 'bytes'),
    'gated': (dict(attention='gated', qkv_bias=True, tie_embeddings=False), 'bytes'),
    'affine': (dict(attention='affine', rope_scaling=LLAMA3_ROPE), 'hf'),  # sharded
    'affine_gated': (dict(attention='affine_gated', affine_act='sigmoid'), 'bytes'),
    'sink_gate': (dict(attention='sink', gate=True), 'bytes'),
    'sink_headwise': (dict(attention='sink', gate='headwise'), 'bytes'),
}
VARIANTS |= {name: (dict(attention=name), 'bytes') for name in ATTENTIONS if name not in VARIANTS}
SHARDED = 'affine'


def is_affine(model):
    return model.config.attention in ('affine', 'affine_gated')


def save_checkpoint(model, tok_info, path):
    """What train.py's ckpt.pt holds (the keys export_hf.py reads, as
    test_distill.save_our_checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(model=model.state_dict(), model_config=dataclasses.asdict(model.config),
                    tokenizer=tok_info, step=3, optimizer={'state': {}}, config={}), path)


@pytest.fixture(scope='module')
def hf_tokenizer(tmp_path_factory):
    """A Llama-3-style teacher's tokenizer directory (byte-level BPE, <|begin_of_text|>), saved by
    transformers itself (5.x writes tokenizer_class "TokenizersBackend", which 4.x refuses);
    config.json names the family."""
    path = tmp_path_factory.mktemp('teacher') / 'Llama-tiny'
    tok = train_hf_bpe(HF_LLAMA3_REGEX, nfc=False,
                       special_tokens=['<|begin_of_text|>', '<|end_of_text|>'])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<|begin_of_text|>',
                            eos_token='<|end_of_text|>').save_pretrained(path)
    (path / 'config.json').write_text(json.dumps({'model_type': 'llama'}))
    return path


@pytest.fixture(scope='module')
def exported(tmp_path_factory, hf_tokenizer):
    """name -> (our model, its tokenizer dict, checkpoint directory, export directory), each
    exported by the CLI."""
    root = tmp_path_factory.mktemp('export')
    encs = {'bytes': ('bytes', load_tokenizer('bytes')),
            'hf': (str(hf_tokenizer), load_tokenizer(str(hf_tokenizer)))}
    result = {}
    torch.manual_seed(0)
    for i, (name, (settings, tokenizer)) in enumerate(VARIANTS.items()):
        spec, enc = encs[tokenizer]
        vocab = 320 if tokenizer == 'bytes' else enc.n_vocab + 14
        model = GPT(ModelConfig(**dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                                       intermediate_size=96,
                                       vocab_size=vocab, block_size=48,
                                       tie_embeddings=True) | settings))
        randomise(model, i)
        # what the variants learn, far from their init (zero alpha_ma, small sinks)
        with torch.no_grad():
            for layer in model.model.layers:
                if is_affine(model):
                    layer.self_attn.alpha_ma.uniform_(0.2, 0.8)
                if model.config.attention == 'sink':
                    layer.self_attn.sinks.normal_(0.0, 2.0)
        tok_info = tokenizer_info(enc, spec)
        save_checkpoint(model, tok_info, root / 'out' / name / 'ckpt.pt')
        shard = ['--max_shard_size=60KB'] if name == SHARDED else []
        export_hf.main([f'--ckpt={root / "out" / name}', f'--out_dir={root / "hf" / name}', *shard])
        result[name] = model.eval(), tok_info, root / 'out' / name, root / 'hf' / name
    return result


@functools.lru_cache(maxsize=None)  # loaded once per export (the tests only read them)
def load_hf(out):
    """The export as transformers loads it: softmax without remote code, the rest with
    trust_remote_code=True."""
    remote = 'auto_map' in json.loads((out / 'config.json').read_text())
    return AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote).eval()


def right_padded(lens, T):
    return (torch.arange(T)[None, :] < torch.tensor(lens)[:, None]).long()

# -----------------------------------------------------------------------------
# transformers: logits, padded batches, generate


@pytest.mark.parametrize('name', VARIANTS)
def test_transformers_logits_equal_ours(name, exported):
    model, tok_info, _, out = exported[name]
    hf = load_hf(out)
    classes = {'softmax': 'LlamaForCausalLM', 'softmax_qwen2': 'Qwen2ForCausalLM'}
    assert type(hf).__name__ == classes.get(name, 'AffineScaledForCausalLM')
    T, lens = 40, [40, 29, 5]
    idx = torch.randint(0, tok_info['n_vocab'], (3, T), generator=torch.Generator().manual_seed(1))
    mask = right_padded(lens, T)
    with torch.no_grad():
        got, expected = hf(idx).logits, model(idx)[0]
        got_padded, expected_padded = hf(idx,
                                         attention_mask=mask).logits, model(
            idx, seq_lens=torch.tensor(lens))[0]
        # and what a padded batch must give: each sequence alone, unpadded (affine: N = its own
        # length)
        alone = [model(idx[b:b + 1, :n])[0][0] for b, n in enumerate(lens)]
        loss = hf(idx, labels=idx).loss
    scale = expected.abs().max().item()
    err = (got - expected).abs().max().item()
    err_padded = max((got_padded[b, :n] - expected_padded[b, :n]).abs().max().item() for b,
                     n in enumerate(lens))
    err_alone = max((got_padded[b, :n] - alone[b]).abs().max().item() for b, n in enumerate(lens))
    print(f"{name}: max |logit difference| transformers vs ours (float32): {err:.1e} unpadded, "
          f"{err_padded:.1e} right-padded; {err_alone:.1e} vs each sequence alone (max |logit| "
          f"{scale:.1f})")
    assert err <= 1e-5 and err_padded <= 1e-5 and err_alone <= 1e-6 * scale
    # labels as transformers takes them: the loss is the shifted next-token cross-entropy
    assert torch.allclose(loss,
                          F.cross_entropy(expected[:, :-1].flatten(0, 1), idx[:, 1:].flatten()),
                          rtol=1e-5)
    # without the mask, N is the padded length: the mask really reaches model.py
    if is_affine(model):
        assert (got[2, :5] - alone[2]).abs().max() > 1e-3


def test_unsupported_inputs_are_refused(exported):
    hf = load_hf(exported['affine'][3])
    idx = torch.randint(0, 300, (2, 8))
    with pytest.raises(ValueError, match='not supported'):
        hf(idx, output_hidden_states=True)
    for mask in (torch.tensor([[1] * 8, [0, 0, 1, 1, 1, 1, 1, 1]]),  # left padding
                 torch.tensor([[1] * 8, [1, 1, 0, 1, 1, 1, 1, 1]]),  # a hole
                 torch.tensor([[1] * 8, [0] * 8])):  # an empty row
        with pytest.raises(ValueError, match='only right padding'):
            hf(idx, attention_mask=mask)


@pytest.mark.parametrize('name', VARIANTS)
def test_generate_equals_ours(name, exported):
    model, tok_info, _, out = exported[name]
    hf = load_hf(out)
    prompt = torch.randint(0, tok_info['n_vocab'], (2, 6),
                           generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                          do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, 8, temperature=0)
    # transformers stops a batch early once every row has produced the end-of-text token
    assert got.size(1) > prompt.size(1) and torch.equal(got, expected[:, :got.size(1)])
    if got.size(1) < expected.size(1):
        assert (got[:, prompt.size(1):] == tok_info['eos_id']).any(dim=1).all()

# -----------------------------------------------------------------------------
# The files


def read_weights(out):
    index = out / 'model.safetensors.index.json'
    names = ['model.safetensors']
    if index.exists():
        names = sorted(set(json.loads(index.read_text())['weight_map'].values()))
    state = {}
    for name in names:
        state.update(load_file(out / name))
    return state, names


@pytest.mark.parametrize('name', VARIANTS)
def test_exported_files(name, exported):
    model, tok_info, _, out = exported[name]
    cfg = model.config
    state, shards = read_weights(out)
    expected = {k: v for k, v in model.state_dict().items()
                if not (cfg.tie_embeddings and k == 'lm_head.weight')}
    assert state.keys() == expected.keys() and all(torch.equal(state[k], v) for k,
                                                   v in expected.items())
    assert (name == SHARDED) == (len(shards) > 1)
    variant_keys = {k.rsplit('.', 1)[-1] for k in state if '.self_attn.' in k} - {'weight', 'bias'}
    assert variant_keys == {'sink': {'sinks'}, 'sink_gate': {'sinks'}, 'sink_headwise': {'sinks'},
                            'affine': {'alpha_ma'}, 'affine_gated': {'alpha_ma'}}.get(name, set())
    config = json.loads((out / 'config.json').read_text())
    assert config['tokenizer_info'] == tok_info
    assert config[
        'max_position_embeddings'] == cfg.block_size and config[
        'tie_word_embeddings'] == cfg.tie_embeddings
    code = sorted(p.name for p in out.glob('*.py'))
    if cfg.attention == 'softmax':
        assert 'auto_map' not in config and code == []
        assert config['model_type'] == ('qwen2' if cfg.qkv_bias else 'llama')
        assert config['rope_scaling'] == cfg.rope_scaling and config['rope_theta'] == cfg.rope_theta
    else:  # this repository's own files, byte for byte: no second copy of the model
        assert config['model_config'] == dataclasses.asdict(cfg)
        assert code == sorted(export_hf.CODE_FILES)
        assert all((out / os.path.basename(p)).read_bytes() == (ROOT / p).read_bytes()
                   for p in export_hf.CODE_PATHS)
    generation = json.loads((out / 'generation_config.json').read_text())
    assert generation['eos_token_id'] == tok_info['eos_id'] or tok_info['family'] == 'llama3'
    # no temporary directories left
    assert not [p for p in out.parent.iterdir() if p.name.startswith('.')]


@pytest.mark.parametrize('name', ['sink', 'affine'])  # bytes and a BPE
def test_tokenizer_ids_equal_ours(name, exported):
    model, tok_info, _, out = exported[name]
    enc = load_tokenizer(tok_info['spec'])
    # (transformers 5 reads config.json first, which names remote code for the non-softmax variants)
    hf = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    texts = [TEXT, *prep.builtin_corpus()[:3], ''.join(chr(c) for c in range(1, 0x800)),
             'Question: Is it?\nAnswer: no']
    for text in texts:
        ids = hf(text, add_special_tokens=False, verbose=False)['input_ids']
        assert ids == enc.encode_ordinary(text)
        assert hf.decode(ids) == text
    config = json.loads((out / 'tokenizer_config.json').read_text())
    # what transformers 4.x and 5.x both read
    assert config['tokenizer_class'] == 'PreTrainedTokenizerFast'
    assert hf.padding_side == 'right' and hf.model_max_length == model.config.block_size
    if tok_info['family'] == 'bytes':
        assert hf.eos_token_id == 256 and hf.bos_token_id is None and len(hf) == 257
        to_byte = gpt2_unicode_to_byte()  # every byte's token has the byte's id
        assert all(hf.convert_tokens_to_ids(char) == byte for char,
                   byte in to_byte.items()) and len(to_byte) == 256
    else:  # the teacher's files, as they were
        assert ((out / 'tokenizer.json').read_bytes()
                == (Path(tok_info['spec']) / 'tokenizer.json').read_bytes())
        assert hf.bos_token_id == enc.encode_single_token('<|begin_of_text|>')


def test_bfloat16_export(exported, tmp_path):
    model, _, ckpt, _ = exported['affine_gated']
    export_hf.main([f'--ckpt={ckpt}', f'--out_dir={tmp_path / "bf16"}', '--dtype=bfloat16'])
    state, _ = read_weights(tmp_path / 'bf16')
    assert {k for k, t in state.items() if t.dtype != torch.bfloat16} == {k for k in state
                                                                          if k.endswith('alpha_ma')}
    ours = GPT(model.config)
    ours.load_state_dict(model.state_dict())
    ours = ours.to(torch.bfloat16).eval()
    # loaded, then cast (4.x and 5.x); loaded in bf16 directly (5.x; 4.x would round alpha_ma to
    # bf16 there)
    hf = [AutoModelForCausalLM.from_pretrained(tmp_path / 'bf16',
                                               trust_remote_code=True).to(torch.bfloat16)]
    if int(transformers.__version__.split('.')[0]) >= 5:
        hf.append(AutoModelForCausalLM.from_pretrained(tmp_path / 'bf16', trust_remote_code=True,
                                                       dtype=torch.bfloat16))
    idx = torch.randint(0, 257, (2, 24))
    for m in hf:
        # as model.py keeps it in bf16
        assert m.model.layers[0].self_attn.alpha_ma.dtype == torch.float32
        with torch.no_grad():
            assert torch.equal(m.eval()(idx).logits, ours(idx)[0])

# -----------------------------------------------------------------------------
# Round trip through our loaders, and the harness's scoring path


@pytest.mark.parametrize('name', VARIANTS)
def test_round_trip_through_our_loaders(name, exported):
    model, tok_info, _, out = exported[name]
    back = GPT.from_pretrained(str(out))
    assert back.config == model.config
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(t, model.state_dict()[k]) for k, t in back.state_dict().items())
    if model.config.tie_embeddings:
        assert back.lm_head.weight is back.model.embed_tokens.weight
    # as a KD teacher: loaded, and checked against data tokenized with the run's tokenizer
    teacher = distill.load_teacher(str(out))
    assert all(torch.equal(t, model.state_dict()[k]) for k, t in teacher.state_dict().items())
    data_meta = dict(tokenizer=tok_info, vocab_size=tok_info['n_vocab'])
    distill.check_compatibility(teacher, str(out), model.config, data_meta, model.config.block_size)
    # eval_zeroshot.py --hf_model: the same model, the run's tokenizer read from the exported files,
    # the same scores
    from_hf, enc = loading.load_model_and_tokenizer(str(out), None, torch.device('cpu'),
                                                    torch.float32)
    from_ckpt, _ = loading.load_model_and_tokenizer(str(exported[name][2]), None,
                                                    torch.device('cpu'), torch.float32)
    assert tokenizer_info(enc, tok_info['spec'])['sha256'] == tok_info['sha256']
    requests = harness_requests(enc, model.config.block_size)
    assert ez.score_requests(from_hf, requests, 4) == ez.score_requests(from_ckpt, requests, 4)


def harness_requests(enc, max_length):
    docs = [ez.choice_doc('Question: Which is a gas?\nAnswer:', ['steam', 'ice', 'a rock'], 0),
            ez.choice_doc('The cat sat on '
                          'the', ['mat', 'dog'], 0), ez.choice_doc('x', ['yz', 'w'], 1)]
    return ez.encode_docs('heldout', docs, enc, max_length)


@pytest.mark.parametrize('name', ['softmax', 'affine'])
def test_harness_scoring_path_equals_eval_zeroshot(name, exported):
    """lm-evaluation-harness 0.4.9's HFLM at batch size 1 (what `lm_eval --model hf` runs):
    model(input).logits, no attention mask, log_softmax over the continuation's rows, the
    continuation's log-probabilities summed. Its per-choice log-likelihoods equal eval_zeroshot.py's
    on the checkpoint (the one-request-per-forward scorer)."""
    model, tok_info, _, out = exported[name]
    hf = load_hf(out)
    requests = harness_requests(load_tokenizer(tok_info['spec']), model.config.block_size)
    with torch.no_grad():
        harness = [F.log_softmax(hf(torch.tensor([inp])).logits[0, -len(cont):], dim=-1)
                   .gather(1, torch.tensor(cont)[:, None]).sum().item() for inp, cont in requests]
    ours = ez.score_one_by_one(model, requests)
    print(f"{name}: max |loglik difference| harness path vs eval_zeroshot: "
          f"{max(abs(a - b) for a, b in zip(harness, ours)):.1e}")
    assert harness == pytest.approx(ours, abs=1e-4, rel=1e-6)

# -----------------------------------------------------------------------------
# transformers 4.x


TRANSFORMERS4_SCRIPT = r'''
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
assert transformers.__version__.startswith('4.'), transformers.__version__
cases, results = json.loads(sys.argv[1]), {}
for name, (out, idx, mask, text) in cases.items():
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(torch.tensor(idx), attention_mask=torch.tensor(mask)).logits
        generated = model.generate(torch.tensor(idx)[:1, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
    results[name] = dict(logits=logits.tolist(), ids=tok(text, add_special_tokens=False)['input_ids'],
                         cls=type(model).__name__, generated=generated.shape[1], version=transformers.__version__)
print(json.dumps(results))
'''  # noqa: E501 (the script's own lines, kept as they run)


@pytest.mark.skipif(not os.path.isfile(TRANSFORMERS4_PYTHON),
                    reason=f"no transformers 4.x interpreter at {TRANSFORMERS4_PYTHON} (set "
                           "TRANSFORMERS4_PYTHON)")
def test_transformers_4_reads_the_exports(exported):
    T, lens = 20, [20, 13]
    idx = torch.randint(0, 257, (2, T), generator=torch.Generator().manual_seed(3))
    mask = right_padded(lens, T)
    names = list(VARIANTS)
    cases = {name: (str(exported[name][3]), idx.tolist(), mask.tolist(), TEXT) for name in names}
    run = subprocess.run([TRANSFORMERS4_PYTHON, '-c', TRANSFORMERS4_SCRIPT, json.dumps(cases)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for name in names:
        model, tok_info, _, _ = exported[name]
        r = results[name]
        got = torch.tensor(r['logits'])
        with torch.no_grad():
            expected = model(idx, seq_lens=torch.tensor(lens))[0]
        err = max((got[b, :n] - expected[b, :n]).abs().max().item() for b, n in enumerate(lens))
        print(f"transformers {r['version']}, {name}: max |logit difference| {err:.1e} "
              "(right-padded batch)")
        assert err <= 1e-5
        assert (r['ids'] == load_tokenizer(tok_info['spec']).encode_ordinary(TEXT)
                and r['generated'] == 7)

# -----------------------------------------------------------------------------
# Bad input: a clear one-line error, nothing written


def refused(args, match, parent):
    before = sorted(os.listdir(parent)) if os.path.isdir(parent) else None
    with pytest.raises(RunError) as e:
        export_hf.main(args)
    message = str(e.value)
    assert match in message and '\n' not in message, message
    assert (sorted(os.listdir(parent)) if os.path.isdir(parent) else None) == before
    return message


def test_bad_checkpoints(exported, tmp_path):
    real = exported['sink'][2] / 'ckpt.pt'
    (tmp_path / 'garbage.pt').write_bytes(b'not a checkpoint at all')
    (tmp_path / 'empty.pt').write_bytes(b'')
    (tmp_path / 'truncated.pt').write_bytes(real.read_bytes()[:5000])
    torch.save(dict(model={}), tmp_path / 'partial.pt')
    state = torch.load(real)
    state['model_config']['n_layer'] = 3
    torch.save(state, tmp_path / 'other_shape.pt')
    out = tmp_path / 'hf' / 'x'
    for ckpt, match in [(tmp_path / 'nowhere', 'no such checkpoint'),
                        (tmp_path, 'no such checkpoint'),
                        # (issue 53) not torch's advice to save with _use_new_zipfile_serialization
                        (tmp_path / 'garbage.pt',
                         'not a readable checkpoint of train.py (its 23 bytes are not the zip '
                         'archive torch.save writes)'),
                        (tmp_path / 'empty.pt',
                         'not a readable checkpoint of train.py (the file is empty)'),
                        (tmp_path / 'truncated.pt', 'not a readable checkpoint'),
                        (tmp_path / 'partial.pt', 'not a checkpoint written by train.py'),
                        (tmp_path / 'other_shape.pt', 'not a readable checkpoint')]:
        refused([f'--ckpt={ckpt}', f'--out_dir={out}'], match, tmp_path)
    assert not (tmp_path / 'hf').exists()


def test_an_unfinished_run_is_exported_only_when_asked(exported, tmp_path):
    """Issue 62: a checkpoint of a run stopped at step 29 of 300 was exported as if it were the
    run's model. Now the export is refused in one line that says so (nothing written), and
    --allow_unfinished=True exports it."""
    model, tok_info, _, _ = exported['sink']
    ckpt = tmp_path / 'run' / 'ckpt.pt'
    ckpt.parent.mkdir()
    torch.save(dict(model=model.state_dict(), model_config=dataclasses.asdict(model.config),
                    tokenizer=tok_info, step=29, optimizer={'state': {}},
                    config=dict(max_iters=300)), ckpt)
    out = tmp_path / 'hf'
    done = subprocess.run([sys.executable, 'export_hf.py', f'--ckpt={ckpt.parent}',
                           f'--out_dir={out}', '--check=False'], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"export_hf.py: error: {ckpt} holds step 29 of its run's max_iters=300: the run has not "
        "finished; continue it with the train.py command that started it (it continues from this "
        "checkpoint), or pass --allow_unfinished=True to use it as it is"], done.stderr
    assert not out.exists()
    export_hf.main([f'--ckpt={ckpt.parent}', f'--out_dir={out}', '--check=False',
                    '--allow_unfinished=True'])
    assert (out / 'config.json').is_file() and (out / 'model.safetensors').is_file()


def test_out_dir_holding_something_else_is_refused(exported, tmp_path):
    ckpt = exported['gated'][2]
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'mine.txt').write_text('keep me')
    (tmp_path / 'a_file').write_text('')
    for out, match in [(tmp_path / 'notes', 'already holds files (mine.txt)'),
                       (tmp_path / 'a_file', 'is a file')]:
        for overwrite in ('False', 'True'):
            refused([f'--ckpt={ckpt}', f'--out_dir={out}', f'--overwrite={overwrite}'], match,
                    tmp_path)
    assert (tmp_path / 'notes' / 'mine.txt').read_text() == 'keep me'
    # an earlier export: replaced only when asked to
    (tmp_path / 'empty').mkdir()
    export_hf.main([f'--ckpt={ckpt}', f'--out_dir={tmp_path / "empty"}'])
    assert 'pass --overwrite=True' in refused([f'--ckpt={exported["sink"][2]}',
                                               f'--out_dir={tmp_path / "empty"}'],
                                              'already holds files', tmp_path)
    export_hf.main([f'--ckpt={exported["sink"][2]}', f'--out_dir={tmp_path / "empty"}',
                    '--overwrite=True', '--check=False'])
    assert json.loads(
        (tmp_path / 'empty' / 'config.json').read_text())['model_config']['attention'] == 'sink'
    assert sorted(os.listdir(tmp_path)) == ['a_file', 'empty', 'notes']


def test_tokenizers_that_cannot_be_exported(exported, hf_tokenizer, tmp_path):
    model, tok_info, _, _ = exported['softmax']
    out = tmp_path / 'hf' / 'x'
    # a tiktoken file (Llama-3's original/tokenizer.model): no Hugging Face files to ship
    enc = load_tokenizer(str(hf_tokenizer))
    write_tiktoken_file(tmp_path / 'tokenizer.model', enc._mergeable_ranks)
    tiktoken_file = str(tmp_path / 'tokenizer.model')
    file_info = tokenizer_info(load_tokenizer(tiktoken_file), tiktoken_file)
    save_checkpoint(model, file_info, tmp_path / 'file' / 'ckpt.pt')
    refused([f'--ckpt={tmp_path / "file"}', f'--out_dir={out}'], 'cannot be exported', tmp_path)
    # the teacher's directory has moved: --tokenizer says where it is now, and must hold the same
    # tokenizer
    save_checkpoint(model, dict(tok_info, spec=str(tmp_path / 'moved')),
                    tmp_path / 'moved_ckpt' / 'ckpt.pt')
    assert 'pass --tokenizer=' in refused([f'--ckpt={tmp_path / "moved_ckpt"}', f'--out_dir={out}'],
                                          'cannot be exported', tmp_path)
    other = tmp_path / 'other_tokenizer'
    other.mkdir()
    (other / 'config.json').write_text(json.dumps({'model_type': 'llama'}))
    tok = train_hf_bpe(HF_LLAMA3_REGEX, nfc=False,
                       special_tokens=['<|end_of_text|>', '<|begin_of_text|>'])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<|begin_of_text|>',
                            eos_token='<|end_of_text|>').save_pretrained(other)
    refused([f'--ckpt={tmp_path / "moved_ckpt"}', f'--out_dir={out}', f'--tokenizer={other}'],
            'is not the one the run trained with', tmp_path)
    refused([f'--ckpt={exported["sink"][2]}', f'--out_dir={out}', f'--tokenizer={other}'],
            'bytes tokenizer', tmp_path)
    export_hf.main([f'--ckpt={tmp_path / "moved_ckpt"}', f'--out_dir={out}',
                    f'--tokenizer={hf_tokenizer}'])
    assert json.loads((out / 'config.json').read_text())['model_type'] == 'llama'


def test_a_failed_export_leaves_nothing(exported, tmp_path, monkeypatch):
    ckpt, out = exported['affine'][2], tmp_path / 'new' / 'affine'
    # a crash while the weights are written (a full disk, Ctrl-C): the error itself, no directory
    # left behind
    real_save = export_hf.write_safetensors

    def crash(state, path, max_shard_bytes):
        real_save(dict(list(state.items())[:3]), path, max_shard_bytes)
        raise KeyboardInterrupt

    monkeypatch.setattr(export_hf, 'write_safetensors', crash)
    with pytest.raises(KeyboardInterrupt):
        export_hf.main([f'--ckpt={ckpt}', f'--out_dir={out}'])
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    # weights that would not give our logits are caught by the check before anything is in place
    real_state = export_hf.export_state_dict

    def wrong(model, dtype):
        state = real_state(model, dtype)
        state[
            'model.layers.1.self_attn.alpha_ma'] = state['model.layers.1.self_attn.alpha_ma'] + 0.1
        return state

    monkeypatch.setattr(export_hf, 'export_state_dict', wrong)
    refused([f'--ckpt={ckpt}', f'--out_dir={out}'], "differ from ours", tmp_path)
    assert os.listdir(tmp_path) == []
