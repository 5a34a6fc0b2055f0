"""Tests for prepare_data.py: tokenizers (round trip, exact parity with Hugging Face `tokenizers` on tiny
tokenizers built here), shard files, the CLI pipeline (determinism, resume, bad input)."""
import base64
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import prepare_data as prep  # noqa: E402

# Text with unicode (accents, CJK, emoji), whitespace runs, tabs, CRLF, digit runs and contractions.
TEXT = ("Hello,   world! It's 2024; we've 1234567 items\u2014costing $3.50 (½ off).\n\n"
        "  Ünïcödé: naïve café, 你好世界, 🤖🚀 emoji\ttab\r\nCRLF line.   \n"
        "THEY'RE LOUD'LL 'S 0.001 x=42*y  \n\n\n   trailing   ")
# The pre-tokenizer regexes as the HF tokenizers of Llama-3 (tokenizer.json, "Split" pre-tokenizer) and Qwen1.5/2
# (PRETOKENIZE_REGEX of transformers' tokenization_qwen2.py) use them; written out independently of prepare_data.
HF_LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
HF_QWEN2_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def corpus():
    return prep.builtin_corpus()


def train_hf_bpe(regex, nfc, special_tokens):
    """A tiny byte-level BPE, set up like Llama-3's / Qwen's tokenizer.json; specials get ids after the merges."""
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus()[:40] + [TEXT], trainer)
    tok.add_special_tokens(special_tokens)
    return tok


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def write_tiktoken_file(path, ranks):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))


def write_two_byte_vocabulary(path):
    """A tiktoken file with every byte and every pair of bytes: 65,792 ranks, so ids beyond uint16."""
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    write_tiktoken_file(path, {t: r for r, t in enumerate([bytes([a]) for a in range(256)] + pairs)})
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Fake checkpoint directories (name -> (dir, the HF tokenizer it must match))."""
    root = tmp_path_factory.mktemp("checkpoints")
    qwen = train_hf_bpe(HF_QWEN2_REGEX, nfc=True, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Qwen as tokenizer.json ... (its tokenizer_config.json names the EOS and no BOS, as Qwen1.5's)
    write_json(root / "qwen_json" / "config.json", {"model_type": "qwen2"})
    qwen.save(str(root / "qwen_json" / "tokenizer.json"))
    qwen_config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|endoftext|>"}
    write_json(root / "qwen_json" / "tokenizer_config.json", qwen_config)
    # ... and as vocab.json + merges.txt, with the special tokens in tokenizer_config.json (as Qwen1.5 ships them)
    write_json(root / "qwen_vocab" / "config.json", {"model_type": "qwen2"})
    qwen.model.save(str(root / "qwen_vocab"))
    added = {str(qwen.token_to_id(t)): {"content": t, "special": True}
             for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
    write_json(root / "qwen_vocab" / "tokenizer_config.json", {"added_tokens_decoder": added, **qwen_config})
    # Llama-3 style: original/tokenizer.model (tiktoken format) next to config.json; its ranks are the HF ids.
    llama = train_hf_bpe(HF_LLAMA3_REGEX, nfc=False, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    to_byte = prep.gpt2_unicode_to_byte()
    ranks = {bytes(to_byte[c] for c in t): i for t, i in llama.get_vocab(with_added_tokens=False).items()}
    write_json(root / "llama" / "config.json", {"model_type": "llama"})
    write_tiktoken_file(root / "llama" / "original" / "tokenizer.model", ranks)
    return {"qwen_json": (root / "qwen_json", qwen), "qwen_vocab": (root / "qwen_vocab", qwen),
            "llama": (root / "llama", llama)}


def run(tmp_path, *flags, out="out"):
    out_dir = tmp_path / out
    return prep.main([f"--out_dir={out_dir}", "--num_proc=1", *flags]), out_dir


def split_docs(out_dir, split):
    """The documents of one split of a bytes-tokenized out_dir (each ends with <|endoftext|> = 256)."""
    meta = json.loads((out_dir / "meta.json").read_text())
    ids = np.concatenate([prep.read_shard(out_dir / name) for name in meta["splits"][split]["shards"]])
    assert ids[-1] == 256
    ends = np.flatnonzero(ids == 256)
    return [bytes(ids[start:end].astype(np.uint8)).decode() for start, end in zip([0, *(ends[:-1] + 1)], ends)]


def shard_bytes(out_dir):
    return {p.name: p.read_bytes() for p in sorted(out_dir.glob("*.bin"))}

# -----------------------------------------------------------------------------
# Tokenizers


@pytest.mark.parametrize("kind", ["bytes", "llama_file", "llama", "qwen_json", "qwen_vocab"])
def test_round_trip(kind, checkpoints):
    spec = {"bytes": "bytes", "llama_file": str(checkpoints["llama"][0] / "original" / "tokenizer.model")}.get(kind)
    enc = prep.load_tokenizer(spec or str(checkpoints[kind][0]))
    assert isinstance(enc, tiktoken.Encoding)
    for text in [TEXT, *corpus()[60:63]]:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        assert kind == "bytes" or len(ids) < len(text.encode()) * 0.8  # a real BPE merges


@pytest.mark.parametrize("kind", ["llama", "qwen_json", "qwen_vocab"])
def test_same_ids_as_hugging_face(kind, checkpoints):
    model_dir, hf = checkpoints[kind]
    enc = prep.load_tokenizer(str(model_dir))
    assert enc.name == ("llama3" if kind == "llama" else "qwen2")  # picked from config.json
    texts = [TEXT, *corpus()[:3], *corpus()[40:79]]  # seen and unseen by the BPE trainer
    for text in texts:
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids
        assert enc.encode(text) == enc.encode_ordinary(text)
    # document boundaries use the teacher's special tokens, with the HF ids
    doc = prep.encode_document(enc, "Hi there")
    if kind == "llama":
        assert doc[0] == hf.token_to_id("<|begin_of_text|>") and doc[1:] == enc.encode_ordinary("Hi there")
    else:
        assert doc[-1] == hf.token_to_id("<|endoftext|>") and doc[:-1] == enc.encode_ordinary("Hi there")


def test_qwen_normalises_to_nfc(checkpoints):
    model_dir, hf = checkpoints["qwen_json"]
    enc = prep.load_tokenizer(str(model_dir))
    decomposed = unicodedata.normalize("NFD", "café naïve Ünïcödé Å ñ ")
    assert decomposed != unicodedata.normalize("NFC", decomposed)
    ids = enc.encode_ordinary(decomposed)
    assert ids == hf.encode(decomposed).ids == enc.encode_ordinary(unicodedata.normalize("NFC", decomposed))
    assert ids != tiktoken.Encoding.encode_ordinary(enc, decomposed)  # without NFC the ids would differ
    assert enc.encode(decomposed) == list(enc.encode_to_numpy(decomposed)) == ids


@pytest.mark.parametrize("pattern, hf_regex", [(prep.LLAMA3_PATTERN, HF_LLAMA3_REGEX),
                                               (prep.QWEN2_PATTERN, HF_QWEN2_REGEX)])
def test_pretokenizer_pattern_matches_hf(pattern, hf_regex):
    """tiktoken's regex engine must split text into the same pieces as the HF pre-tokenizer. An Encoding whose
    vocabulary holds every substring of the text encodes each piece as one token, which reveals the pieces."""
    text = TEXT + " don'T 123456789 a\u00a0b \u2003\n \n\t\n" + corpus()[0][:300]
    data = text.encode()
    substrings = {data[i:j] for i in range(len(data)) for j in range(i + 1, min(len(data), i + 40) + 1)}
    enc = tiktoken.Encoding("pieces", pat_str=pattern, special_tokens={},
                            mergeable_ranks={s: r for r, s in enumerate(sorted(substrings, key=lambda s: (len(s), s)))})
    pieces = [b.decode() for b in enc.decode_tokens_bytes(enc.encode_ordinary(text))]
    hf_pieces = [p for p, _ in pre_tokenizers.Split(Regex(hf_regex), behavior="isolated").pre_tokenize_str(text)]
    assert pieces == hf_pieces
    assert any(p.isdigit() and len(p) == 3 for p in pieces) == (pattern == prep.LLAMA3_PATTERN)


def test_llama3_special_tokens():
    specials = prep.llama3_special_tokens(128000)
    assert len(specials) == 256 and sorted(specials.values()) == list(range(128000, 128256))
    assert specials["<|begin_of_text|>"] == 128000 and specials["<|end_of_text|>"] == 128001
    assert specials["<|eot_id|>"] == 128009


def test_bad_tokenizers(tmp_path, checkpoints):
    with pytest.raises(SystemExit, match="unknown tokenizer"):
        prep.load_tokenizer("gpt-17")
    # a model directory without tokenizer files (config.json is not read for the tokenizer)
    write_json(tmp_path / "mistral" / "config.json", {"model_type": "mistral"})
    with pytest.raises(SystemExit, match="has no tokenizer.json, vocab.json \\+ merges.txt, or original/tokenizer"):
        prep.load_tokenizer(str(tmp_path / "mistral"))
    (tmp_path / "sentencepiece.model").write_bytes(b"\n\x0f\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    with pytest.raises(SystemExit, match="not a tiktoken BPE file"):
        prep.load_tokenizer(str(tmp_path / "sentencepiece.model"))
    # a vocabulary whose ids do not follow the merge order cannot be reproduced by tiktoken
    qwen_dir, hf = checkpoints["qwen_vocab"]
    vocab = hf.get_vocab(with_added_tokens=False)
    merges = (qwen_dir / "merges.txt").read_text().splitlines()[1:3]  # the first two merges
    first, second = (m.replace(" ", "") for m in merges)
    vocab[first], vocab[second] = vocab[second], vocab[first]
    write_json(tmp_path / "shuffled" / "config.json", {"model_type": "qwen2"})
    write_json(tmp_path / "shuffled" / "vocab.json", vocab)
    (tmp_path / "shuffled" / "merges.txt").write_text("\n".join(["#version: 0.2", *merges]))
    with pytest.raises(SystemExit, match="out of id order"):
        prep.load_tokenizer(str(tmp_path / "shuffled"))
    # a directory without its EOS token cannot mark document ends (no tokenizer_class: GPT2Tokenizer's defaults)
    (tmp_path / "shuffled" / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(SystemExit, match="eos_token '<\\|endoftext\\|>' is not one of its special tokens"):
        prep.load_tokenizer(str(tmp_path / "shuffled"))

# -----------------------------------------------------------------------------
# Tokenizers read from their own files (any byte-level BPE directory), against the `tokenizers` library

CODE = ('def f(x, y=3.14e-10):\n\tif x >= 0x1F:  # 🐍 comment\r\n        return {"a": [1, 22, 333, 4444, 55555]}\n'
        '    s = f"{x!r:>10}" + \'don\\\'t\'  \t\n\n    return s.upper()  # WE\'RE   DONE\n')
# Fresh text built from pieces the tokenizers treat differently: letters, contractions, ASCII and other digits
# (Arabic-Indic, superscripts, fractions, Roman numerals, Devanagari, Unicode 16's Kirat Rai), whitespace runs
# (tabs, CRLF, NBSP, ideographic space, line separator), punctuation, emoji with ZWJ and flags, CJK, combining marks.
POOL = (list("abcXYZé") + ["the", "don't", "'s", "'LL", "'ve", "x=1", "O'Neil"] + list("0123456789")
        + ["٣", "²", "½", "Ⅻ", "〇", "१", "12345", "3.14159", "\U00011DE3", "\U00016FF5"]
        + [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028"]
        + list(".,;:!?-_()[]{}<>\"'/\\@#$%^&*+=~`|")
        + ["🤖", "👩\u200d💻", "🇺🇸", "你好", "e\u0301", "한국어", "مرحبا", "नमस्ते", "    return x", "def f(a, b):"])


def fuzz(seed, n=60):
    rng = random.Random(seed)
    return "".join(rng.choice(POOL) for _ in range(n))


def parity_texts():
    return [TEXT, CODE, unicodedata.normalize("NFD", TEXT), *corpus()[40:79], *(fuzz(seed) for seed in range(30))]


def byte_level(use_regex=True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def split_then_bytes(regex):  # Llama-3 and Qwen2's tokenizer.json
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level(False)])


def digits_then_gpt2(individual):  # SmolLM's (and StarCoder's) tokenizer.json
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=individual), byte_level()])


def hf_tokenizer(pre_tokenizer, nfc=False, leading_specials=(), specials=(), inline=(), template=None):
    """A tiny byte-level BPE trained here. leading_specials get the first ids (as SmolLM's), specials ids after the
    merges (as Llama-3's, Qwen's); inline: (content, normalized) added tokens that are not special; template: the
    post-processor's single-text template, e.g. '<s> $A </s>'."""
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(leading_specials), show_progress=False)
    tok.train_from_iterator(corpus()[:40] + [TEXT, CODE], trainer)
    tok.add_special_tokens(list(specials))
    tok.add_tokens([AddedToken(t, special=False, normalized=normalized) for t, normalized in inline])
    if template:
        names = [w for w in template.split() if w != "$A"]
        tok.post_processor = processors.TemplateProcessing(single=template,
                                                           special_tokens=[(n, tok.token_to_id(n)) for n in names])
    return tok


def save_layout(directory, tok, tokenizer_config=None, config=None, special_tokens_map=None):
    """A directory as the hub has them: tokenizer.json and the given JSON files (None: no such file)."""
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    for name, obj in [("tokenizer_config.json", tokenizer_config), ("config.json", config),
                      ("special_tokens_map.json", special_tokens_map)]:
        if obj is not None:
            write_json(directory / name, obj)
    return directory


EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """name -> (directory, its `tokenizers` Tokenizer, the family, the tokens before / after each document)."""
    root = tmp_path_factory.mktemp("layouts")
    chat = [EOT, "<|im_start|>", "<|im_end|>"]
    gpt2_config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT}
    qwen_config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": EOT}
    out = {}

    def add(name, tok, family, boundary, **files):
        out[name] = (save_layout(root / name, tok, **files), tok, family, boundary)

    # a plain tokenizer directory, no config.json: GPT-2's pre-tokenizer
    add("gpt2_no_config", hf_tokenizer(byte_level(), specials=[EOT]), "bpe", ([], [EOT]), tokenizer_config=gpt2_config)
    # a Llama model with SmolLM's tokenizer: Digits + GPT-2's regex, specials at ids 0-2, <|endoftext|> ends documents
    add("smollm_llama", hf_tokenizer(digits_then_gpt2(True), leading_specials=chat), "bpe", ([], [EOT]),
        tokenizer_config=gpt2_config, config={"model_type": "llama"})
    # digit runs isolated; the EOS named only in special_tokens_map.json (an AddedToken dict)
    add("digit_runs", hf_tokenizer(digits_then_gpt2(False), specials=["</s>"]), "bpe", ([], ["</s>"]),
        special_tokens_map={"eos_token": {"content": "</s>", "lstrip": False, "rstrip": False}})
    # a qwen2 model whose tokenizer.json pre-tokenizes with GPT-2's regex (and NFC)
    add("qwen2_gpt2_regex", hf_tokenizer(byte_level(), nfc=True, specials=chat), "bpe", ([], [EOT]),
        tokenizer_config=qwen_config, config={"model_type": "qwen2"})
    # Llama-3's tokenizer.json: its regex, <|begin_of_text|> prepended by the post-processor; no config.json
    llama3 = hf_tokenizer(split_then_bytes(HF_LLAMA3_REGEX), specials=["<|begin_of_text|>", "<|end_of_text|>"],
                          template="<|begin_of_text|> $A")
    llama3_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                     "eos_token": "<|end_of_text|>"}
    add("llama3_json", llama3, "llama3", (["<|begin_of_text|>"], []), tokenizer_config=llama3_config)
    # the hub's Llama-3 layout: the same, plus config.json and Meta's original/tokenizer.model (the same ranks)
    add("llama3_hub", llama3, "llama3", (["<|begin_of_text|>"], []), tokenizer_config=llama3_config,
        config={"model_type": "llama"})
    to_byte = prep.gpt2_unicode_to_byte()
    write_tiktoken_file(root / "llama3_hub" / "original" / "tokenizer.model",
                        {bytes(to_byte[c] for c in t): i for t, i in llama3.get_vocab(with_added_tokens=False).items()})
    # Qwen2.5's shape: NFC, Qwen's regex, added tokens that are not special (<tool_call>) matched inside text
    add("qwen25_inline", hf_tokenizer(split_then_bytes(HF_QWEN2_REGEX), nfc=True, specials=chat,
                                      inline=[("<tool_call>", False), ("</tool_call>", False), ("naïve", True)]),
        "bpe", ([], [EOT]), tokenizer_config=qwen_config, config={"model_type": "qwen2"})
    # a template with BOS and EOS: documents are wrapped the same way
    add("bos_and_eos", hf_tokenizer(byte_level(), specials=["<s>", "</s>"], template="<s> $A </s>"), "bpe",
        (["<s>"], ["</s>"]), tokenizer_config={"bos_token": "<s>", "eos_token": "</s>"})
    return out


LAYOUTS = ["gpt2_no_config", "smollm_llama", "digit_runs", "qwen2_gpt2_regex", "llama3_json", "llama3_hub",
           "qwen25_inline", "bos_and_eos"]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_every_layout_gives_the_ids_of_tokenizers(kind, layouts):
    model_dir, hf, family, (before, after) = layouts[kind]
    enc = prep.load_tokenizer(str(model_dir))
    assert enc.name == family
    for text in parity_texts():
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids, text
    # documents: wrapped as the tokenizer wraps a text (add_special_tokens=True), else EOS after each
    text = fuzz(99)
    plain, wrapped = hf.encode(text, add_special_tokens=False).ids, hf.encode(text).ids
    doc = prep.encode_document(enc, text)
    assert doc == [hf.token_to_id(t) for t in before] + plain + [hf.token_to_id(t) for t in after]
    assert doc == wrapped or (wrapped == plain and not before)
    info = prep.tokenizer_info(enc, str(model_dir))
    assert (info["bos_id"], info["eos_id"]) == (hf.token_to_id(before[0]) if before else None,
                                                hf.token_to_id(after[0]) if after else None)


@pytest.mark.parametrize("pattern, pre_tokenizer", [
    (prep.GPT2_PATTERN, byte_level()),
    (prep.GPT2_DIGITS_PATTERN, digits_then_gpt2(True)),
    (prep.GPT2_DIGIT_RUNS_PATTERN, digits_then_gpt2(False)),
    (prep.LLAMA3_PATTERN, split_then_bytes(HF_LLAMA3_REGEX)),
    (prep.QWEN2_PATTERN, split_then_bytes(HF_QWEN2_REGEX))], ids=["gpt2", "digits", "digit_runs", "llama3", "qwen2"])
def test_pre_tokenizers_split_like_tokenizers(pattern, pre_tokenizer):
    """tiktoken with the pattern cuts fresh text into exactly the pieces of the `tokenizers` pre-tokenizer (a vocabulary
    of every substring makes each piece one token, which reveals the pieces)."""
    to_byte = prep.gpt2_unicode_to_byte()
    for seed in range(40):
        text = fuzz(seed)
        data = text.encode()
        substrings = {data[i:j] for i in range(len(data)) for j in range(i + 1, min(len(data), i + 48) + 1)}
        enc = tiktoken.Encoding("pieces", pat_str=pattern, special_tokens={}, mergeable_ranks={
            s: r for r, s in enumerate(sorted(substrings, key=lambda s: (len(s), s)))})
        hf_pieces = [bytes(to_byte[c] for c in piece) for piece, _ in pre_tokenizer.pre_tokenize_str(text)]
        assert enc.decode_tokens_bytes(enc.encode_ordinary(text)) == hf_pieces, text


def test_issue_14_regressions(tmp_path, layouts):
    """(1) a tokenizer directory without config.json, (2) a Llama model with a GPT-2-style BPE and <|endoftext|>
    (SmolLM's shape), (3) a qwen2 model whose tokenizer.json uses GPT-2's regex: each prepared exactly."""
    docs = corpus()[:12]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    for kind in ("gpt2_no_config", "smollm_llama", "qwen2_gpt2_regex"):
        model_dir, hf, _, _ = layouts[kind]
        assert (model_dir / "config.json").exists() == (kind != "gpt2_no_config")
        meta, out_dir = run(tmp_path, f"--source={src}", f"--tokenizer={model_dir}", "--val_every=4", out=kind)
        eot = hf.token_to_id(EOT)
        val = np.concatenate([prep.read_shard(out_dir / n) for n in meta["splits"]["val"]["shards"]]).tolist()
        assert val == [i for d in docs[::4] for i in hf.encode(d, add_special_tokens=False).ids + [eot]]
        tok = meta["tokenizer"]
        assert (tok["family"], tok["bos_id"], tok["eos_id"], tok["eos_token"]) == ("bpe", None, eot, EOT)
        assert tok["boundary"].startswith("<|endoftext|> after each document") and tok["prefix"] == tok["suffix"] == []
    # (3): " 100" is one GPT-2 piece but three Qwen2 pieces; the ids are the model's own tokenizer's
    model_dir, hf, _, _ = layouts["qwen2_gpt2_regex"]
    enc = prep.load_tokenizer(str(model_dir))
    qwen_regex = tiktoken.Encoding("q", pat_str=prep.QWEN2_PATTERN, mergeable_ranks=enc._mergeable_ranks,
                                   special_tokens={})
    for text in [" 100", "In 1999, 42 of 1234567 people paid $3.50."]:
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids
        assert enc.encode_ordinary(text) != qwen_regex.encode_ordinary(text)


def test_slow_tokenizers_match_transformers(tmp_path, layouts, checkpoints):
    """vocab.json + merges.txt only: GPT-2's conventions by default (<|endoftext|> inside vocab.json, as GPT-2's),
    Qwen2's for tokenizer_class Qwen2Tokenizer; the reference is transformers' tokenizer of the directory."""
    from transformers import GPT2Tokenizer, Qwen2Tokenizer
    hf = layouts["gpt2_no_config"][1]
    slow = tmp_path / "gpt2_slow"
    slow.mkdir()
    hf.model.save(str(slow))
    vocab = json.loads((slow / "vocab.json").read_text())
    write_json(slow / "vocab.json", vocab | {EOT: len(vocab)})
    for model_dir, cls in [(slow, GPT2Tokenizer), (checkpoints["qwen_vocab"][0], Qwen2Tokenizer)]:
        ref = cls.from_pretrained(str(model_dir))
        enc = prep.load_tokenizer(str(model_dir))
        for text in parity_texts():
            assert enc.encode_ordinary(text) == ref(text, add_special_tokens=False)["input_ids"], text
        assert ref("Hi there")["input_ids"] == ref("Hi there", add_special_tokens=False)["input_ids"]  # no BOS
        assert prep.encode_document(enc, "Hi there") == ref("Hi there")["input_ids"] + [ref.eos_token_id]
        assert enc.name == ("qwen2" if cls is Qwen2Tokenizer else "bpe")


def test_transformers_prepends_the_bos_we_put_before_documents(layouts):
    from transformers import AutoTokenizer
    model_dir, hf, _, _ = layouts["llama3_json"]
    ref = AutoTokenizer.from_pretrained(str(model_dir))
    enc = prep.load_tokenizer(str(model_dir))
    for text in [TEXT, CODE]:
        assert prep.encode_document(enc, text) == ref(text)["input_ids"]
        assert enc.encode_ordinary(text) == ref(text, add_special_tokens=False)["input_ids"]


def test_inline_added_tokens_and_special_token_strings(layouts):
    """Added tokens that are not special are matched inside text, as Hugging Face does (normalized=true ones after
    NFC); special tokens' strings are ordinary text, as Hugging Face's encode_special_tokens=True."""
    model_dir, hf, _, _ = layouts["qwen25_inline"]
    enc = prep.load_tokenizer(str(model_dir))
    assert enc.inline == ("<tool_call>", "</tool_call>", "naïve") and enc.inline_normalized == ("naïve",)
    text = ('Call <tool_call>{"n": 12}</tool_call></tool_call>x; ' + unicodedata.normalize("NFD", "naïve café")
            + " naïve")
    ids = enc.encode_ordinary(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert ids.count(hf.token_to_id("<tool_call>")) == 1 and ids.count(hf.token_to_id("naïve")) == 2
    forged = "a <|im_start|>user\n<|endoftext|> b"
    as_text = hf.encode(forged, add_special_tokens=False).ids
    hf.encode_special_tokens = True
    try:
        assert enc.encode_ordinary(forged) == hf.encode(forged, add_special_tokens=False).ids != as_text
    finally:
        hf.encode_special_tokens = False
    with pytest.raises(ValueError, match="special token"):
        enc.encode(forged)
    assert enc.encode(forged, allowed_special="all") == as_text
    assert enc.encode(forged, disallowed_special=()) == enc.encode_ordinary(forged)
    assert list(enc.encode_to_numpy(text)) == ids
    clone = pickle.loads(pickle.dumps(enc))  # what the tokenizer workers get
    assert clone.encode_ordinary(text) == ids and prep.tokenizer_info(clone, "x") == prep.tokenizer_info(enc, "x")


def old_sha256(enc):
    """The sha256 prepare_data.py recorded before it read tokenizers' files (its formula, written out here)."""
    h = hashlib.sha256(json.dumps([enc.name, enc._pat_str, enc.nfc, enc._special_tokens], sort_keys=True).encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    return h.hexdigest()


def test_sha256_keeps_old_data_valid_and_covers_conventions(tmp_path, layouts, checkpoints):
    """The three old conventions keep their sha256 (data and checkpoints made before still match their teachers);
    any other tokenizer's covers its conventions, so a changed document boundary is a different tokenizer."""
    specs = ["bytes", str(checkpoints["llama"][0] / "original" / "tokenizer.model"),
             *(str(checkpoints[k][0]) for k in ("llama", "qwen_json", "qwen_vocab")),
             *(str(layouts[k][0]) for k in ("llama3_json", "llama3_hub"))]
    for spec in specs:
        enc = prep.load_tokenizer(spec)
        assert enc.name in prep.FAMILIES and prep.tokenizer_info(enc, spec)["sha256"] == old_sha256(enc), spec
    sha = lambda spec: prep.tokenizer_info(prep.load_tokenizer(str(spec)), str(spec))["sha256"]
    assert sha(layouts["llama3_hub"][0]) == sha(layouts["llama3_json"][0])  # the same tokenizer, two layouts
    plain = layouts["gpt2_no_config"][0]
    enc = prep.load_tokenizer(str(plain))
    assert prep.tokenizer_info(enc, str(plain))["sha256"] != old_sha256(enc)
    # the same vocabulary, pattern and specials, but <|endoftext|> put before every text: another tokenizer
    hf = layouts["gpt2_no_config"][1]
    tok = Tokenizer.from_str(hf.to_str())
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A", special_tokens=[(EOT, hf.token_to_id(EOT))])
    with_bos = save_layout(tmp_path / "with_bos", tok, tokenizer_config={"eos_token": EOT})
    assert prep.encode_document(prep.load_tokenizer(str(with_bos)), "x") == tok.encode("x").ids
    assert tok.encode("x").ids == [hf.token_to_id(EOT), *hf.encode("x").ids]
    assert sha(with_bos) != sha(plain)


def refusal_cases(root, layouts):
    """name -> (directory, the message it is refused with)."""
    gpt2_dir, gpt2, _, _ = layouts["gpt2_no_config"]
    cases = {}

    def variant(name, message, tok=None, tokenizer_config=None, **files):
        cases[name] = (save_layout(root / name, tok or gpt2, tokenizer_config=tokenizer_config, **files), message)

    def trained(model, pre_tokenizer, trainer):
        tok = Tokenizer(model)
        tok.pre_tokenizer = pre_tokenizer
        tok.train_from_iterator(corpus()[:5], trainer)
        return tok

    eos = {"eos_token": EOT}
    (root / "sentencepiece").mkdir(parents=True)
    (root / "sentencepiece" / "tokenizer.model").write_bytes(b"\n\x0f\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    write_json(root / "sentencepiece" / "config.json", {"model_type": "mistral"})
    cases["sentencepiece"] = (root / "sentencepiece", "has tokenizer.model but no tokenizer.json.*only byte-level BPE")
    variant("sentencepiece_json", "a SentencePiece-style BPE.*only byte-level BPE", trained(
        models.BPE(unk_token="<unk>", byte_fallback=True), pre_tokenizers.Metaspace(),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)), eos)
    variant("wordpiece", "a WordPiece model; only byte-level BPE", trained(
        models.WordPiece(unk_token="[UNK]"), pre_tokenizers.BertPreTokenizer(),
        trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False)), eos)
    variant("unigram", "a Unigram model; only byte-level BPE", trained(
        models.Unigram(), pre_tokenizers.Metaspace(), trainers.UnigramTrainer(vocab_size=100, show_progress=False)),
        eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.normalizer = normalizers.NFKC()
    variant("nfkc", "normalizer NFKC is not supported", tok, eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    variant("lowercase", r"normalizer NFC \+ Lowercase is not supported", tok, eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), byte_level()])
    variant("whitespace_split", r"pre-tokenizer WhitespaceSplit\(\) \+ ByteLevel\(use_regex=True\) is not supported",
            tok, eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    variant("prefix_space", "add_prefix_space=true", tok, eos)
    variant("no_eos", "puts no special token around a text and names no eos_token")
    variant("eos_not_a_token", "eos_token '</s>' is not one of its special tokens",
            tokenizer_config={"eos_token": "</s>"})
    variant("files_disagree", "name different eos_tokens", tokenizer_config=eos,
            special_tokens_map={"eos_token": "</s>"})
    variant("bos_flag_vs_template", "transformers versions differ",
            tokenizer_config={"add_bos_token": True, "bos_token": EOT, "eos_token": EOT})
    variant("llama_class_without_bos", "transformers versions differ",
            tokenizer_config={"tokenizer_class": "LlamaTokenizerFast", "bos_token": EOT, "eos_token": EOT})
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.add_tokens([AddedToken("<tool>", special=False, lstrip=True)])
    variant("lstrip", "added token '<tool>' has lstrip", tok, eos)
    shutil.copytree(layouts["llama3_hub"][0], root / "two_vocabularies")
    write_tiktoken_file(root / "two_vocabularies" / "original" / "tokenizer.model",
                        {bytes([b]): b for b in range(256)})
    cases["two_vocabularies"] = (root / "two_vocabularies", "original/tokenizer.model and tokenizer.json hold "
                                                            "different vocabularies")
    (root / "slow_codegen").mkdir()
    gpt2.model.save(str(root / "slow_codegen"))
    write_json(root / "slow_codegen" / "tokenizer_config.json", {"tokenizer_class": "CodeGenTokenizer"} | eos)
    cases["slow_codegen"] = (root / "slow_codegen", "tokenizer_class 'CodeGenTokenizer'.*supported without a "
                                                    "tokenizer.json: GPT2Tokenizer")
    (root / "empty").mkdir()
    cases["empty"] = (root / "empty", "has no tokenizer.json, vocab.json \\+ merges.txt, or original/tokenizer.model")
    assert gpt2_dir.is_dir()
    return cases


def test_unsupported_tokenizers_are_refused_before_anything_is_written(tmp_path, layouts):
    for name, (model_dir, message) in refusal_cases(tmp_path / "dirs", layouts).items():
        with pytest.raises(SystemExit, match=message):
            prep.load_tokenizer(str(model_dir))
        with pytest.raises(SystemExit, match=message):
            run(tmp_path, f"--tokenizer={model_dir}", out=name)
        assert not (tmp_path / name).exists(), name

# -----------------------------------------------------------------------------
# Shards


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_shard_round_trip_and_header_validation(tmp_path, dtype):
    path = str(tmp_path / "x.bin")
    tokens = np.array([0, 1, 256, np.iinfo(dtype).max], dtype=dtype)
    prep.write_shard(path, [tokens[:1], tokens[1:]], dtype)
    read = prep.read_shard(path)
    assert read.dtype == np.dtype(dtype) and isinstance(read, np.memmap) and not read.flags.writeable
    np.testing.assert_array_equal(read, tokens)
    assert os.listdir(tmp_path) == ["x.bin"]  # no temp file left behind
    data = Path(path).read_bytes()
    for wrong_size in (data[:-1], data + b"\0\0"):
        Path(path).write_bytes(wrong_size)
        with pytest.raises(SystemExit, match="truncated or corrupt"):
            prep.read_shard(path)
    Path(path).write_bytes(b"NOTSHARD" + data[8:])
    with pytest.raises(SystemExit, match="bad magic"):
        prep.read_shard(path)
    Path(path).write_bytes(data[:10])
    with pytest.raises(SystemExit, match="bad magic"):
        prep.read_shard(path)

# -----------------------------------------------------------------------------
# The pipeline


def test_builtin_bytes_layout_and_meta(tmp_path):
    meta, out_dir = run(tmp_path, "--source=builtin", "--tokenizer=bytes", "--val_every=10")
    docs = corpus()
    assert split_docs(out_dir, "val") == docs[::10]  # held-out whole documents 0, 10, 20, ...
    assert split_docs(out_dir, "train") == [d for i, d in enumerate(docs) if i % 10]
    on_disk = json.loads((out_dir / "meta.json").read_text())
    assert on_disk == meta and meta["complete"]
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["tokenizer"]["eos_id"] == 256
    assert meta["splits"]["val"]["documents"] == 8 and meta["splits"]["train"]["documents"] == 71
    assert meta["splits"]["train"]["tokens"] == sum(len(d.encode()) + 1 for i, d in enumerate(docs) if i % 10)
    assert "--source=builtin" in meta["command"]
    enc = prep.load_tokenizer(meta["tokenizer"]["spec"])  # the spec rebuilds the same tokenizer
    assert prep.tokenizer_info(enc, "bytes")["sha256"] == meta["tokenizer"]["sha256"]
    # running again on a complete directory does nothing
    before = shard_bytes(out_dir)
    run(tmp_path, "--source=builtin", "--tokenizer=bytes", "--val_every=10")
    assert shard_bytes(out_dir) == before


def test_llama_checkpoint_shards(tmp_path, checkpoints):
    model_dir, hf = checkpoints["llama"]
    src = tmp_path / "docs.jsonl"
    docs = corpus()[:30]
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    meta, out_dir = run(tmp_path, f"--source={src}", f"--tokenizer={model_dir}", "--text_field=body", "--val_every=5")
    bos = hf.token_to_id("<|begin_of_text|>")
    val = np.concatenate([prep.read_shard(out_dir / n) for n in meta["splits"]["val"]["shards"]]).tolist()
    assert val == [i for d in docs[::5] for i in [bos] + hf.encode(d).ids]  # <|begin_of_text|> before each document
    assert meta["tokenizer"]["bos_id"] == bos and meta["tokenizer"]["eos_id"] is None


@pytest.mark.parametrize("kind", ["txt_document", "txt_paragraph", "json_array", "parquet"])
def test_local_file_formats(tmp_path, kind):
    docs = [f"Document {i}: {d[:200]}" for i, d in enumerate(corpus()[:12])]
    if kind == "txt_document":  # one document per file, files given as a glob
        for i, d in enumerate(docs):
            (tmp_path / f"doc{i:02d}.txt").write_text(d)
        flags = [f"--source={tmp_path}/doc*.txt"]
    elif kind == "txt_paragraph":
        docs = [re.sub(r"\n+", "\n", d).strip() for d in docs]  # no blank lines inside
        (tmp_path / "all.txt").write_text("\n\n".join(docs))
        flags = [f"--source={tmp_path / 'all.txt'}", "--txt_sample_by=paragraph"]
    elif kind == "json_array":
        (tmp_path / "a.json").write_text(json.dumps([{"text": d} for d in docs[:5]]))
        (tmp_path / "b.json").write_text(json.dumps([{"text": d} for d in docs[5:]]))
        flags = [f"--source={tmp_path / 'a.json'},{tmp_path / 'b.json'}"]
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), tmp_path / "d.parquet", row_group_size=4)
        flags = [f"--source={tmp_path / 'd.parquet'}"]
    meta, out_dir = run(tmp_path, *flags, "--val_every=4")
    assert split_docs(out_dir, "val") == docs[::4]
    assert split_docs(out_dir, "train") == [d for i, d in enumerate(docs) if i % 4]


def test_fineweb_edu_is_streamed_and_stops_at_max_tokens(tmp_path, monkeypatch):
    import datasets
    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return datasets.Dataset.from_dict({"text": corpus(), "url": ["x"] * 79}).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(prep, "CHUNK_CHARS", 100_000)
    meta, out_dir = run(tmp_path, "--source=fineweb-edu", "--fineweb_config=sample-100BT", "--max_tokens=250000",
                        "--shard_tokens=50000")
    assert calls == [("HuggingFaceFW/fineweb-edu", dict(name="sample-100BT", split="train", streaming=True))]
    train = meta["splits"]["train"]
    assert train["tokens"] == 250_000 == sum(len(prep.read_shard(out_dir / n)) for n in train["shards"])
    assert len(train["shards"]) >= 2
    lengths = [len(d.encode()) + 1 for i, d in enumerate(corpus()) if i % 100]
    assert train["documents"] == int(np.searchsorted(np.cumsum(lengths), 250_000) + 1)  # the last one is cut


def test_output_does_not_depend_on_num_proc(tmp_path, monkeypatch, checkpoints):
    monkeypatch.setattr(prep, "CHUNK_CHARS", 30_000)  # many chunks, so that two workers really interleave
    qwen = checkpoints["qwen_json"][0]  # its NFC-normalising Encoding must reach the workers intact
    flags = ["--source=builtin", f"--tokenizer={qwen}", "--val_every=7", "--shard_tokens=40000"]
    meta1, out1 = run(tmp_path, *flags, out="one")
    meta2 = prep.main([f"--out_dir={tmp_path / 'two'}", "--num_proc=2", *flags])
    assert len(meta1["splits"]["train"]["shards"]) >= 3
    assert shard_bytes(out1) == shard_bytes(tmp_path / "two")
    for meta in (meta1, meta2):
        del meta["command"]
    assert meta1 == meta2


def test_resume_after_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(prep, "CHUNK_CHARS", 30_000)
    flags = ["--source=builtin", "--tokenizer=bytes", "--val_every=7", "--shard_tokens=100000"]
    _, reference = run(tmp_path, *flags, out="reference")

    real_write_shard, writes = prep.write_shard, []

    class Crash:  # an "array" whose data cannot be read: the process dies in the middle of writing a shard
        def __len__(self):
            return 1000

        def __array__(self, dtype=None, copy=None):
            raise KeyboardInterrupt

    def dying_write_shard(path, arrays, dtype):  # the 4th shard dies half-written
        writes.append(os.path.basename(path))
        real_write_shard(path, [*arrays, Crash()] if len(writes) == 4 else arrays, dtype)

    monkeypatch.setattr(prep, "write_shard", dying_write_shard)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, *flags)
    out_dir = tmp_path / "out"
    crashed = json.loads((out_dir / "meta.json").read_text())
    assert writes == ["train_000000.bin", "val_000000.bin", "train_000001.bin", "val_000001.bin"]
    assert not crashed["complete"] and crashed["progress"]["shards"] == 1 and crashed["progress"]["documents_read"] > 0
    finished = {n: (out_dir / n).stat().st_mtime_ns for n in ["train_000000.bin", "val_000000.bin"]}
    assert (out_dir / "train_000001.bin").exists()  # written, but not yet recorded in meta.json: redone on resume
    assert not (out_dir / "val_000001.bin").exists()
    with pytest.raises(SystemExit, match="truncated"):  # the half-written shard does not look valid
        prep.read_shard(out_dir / "val_000001.bin.tmp")

    monkeypatch.setattr(prep, "write_shard", real_write_shard)
    tokenized, real_tokenize_chunk = [], prep.tokenize_chunk
    monkeypatch.setattr(prep, "tokenize_chunk", lambda docs: tokenized.extend(docs) or real_tokenize_chunk(docs))
    meta, _ = run(tmp_path, *flags)
    assert meta["complete"]
    # only the documents after the finished shards were read and tokenized again
    assert [text for _, text in tokenized] == corpus()[crashed["progress"]["documents_read"]:]
    assert {n: (out_dir / n).stat().st_mtime_ns for n in finished} == finished  # finished shards untouched
    assert shard_bytes(out_dir) == shard_bytes(reference)
    assert not list(out_dir.glob("*.tmp"))


# -----------------------------------------------------------------------------
# Bad input: a clear error (SystemExit with a message) and no output directory


def test_bad_input_leaves_no_output(tmp_path, monkeypatch, checkpoints):
    (tmp_path / "content.jsonl").write_text(json.dumps({"content": "hello"}) + "\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "just one document"}) + "\n")
    (tmp_path / "notes.md").write_text("# hi")
    big_vocab = write_two_byte_vocabulary(tmp_path / "big.model")
    cases = [
        ([f"--source={tmp_path / 'missing.jsonl'}"], "matches no file"),
        ([f"--source={tmp_path / 'nothing*.parquet'}"], "matches no file"),
        ([f"--source={tmp_path / 'notes.md'}"], "supported extension"),
        ([f"--source={tmp_path / 'one.jsonl'},{tmp_path / 'empty.txt'}"], "mixes file types"),
        ([f"--source={tmp_path / 'content.jsonl'}"], "no such text field.*fields: content"),
        ([f"--source={tmp_path / 'empty.txt'}"], "no documents"),
        ([f"--source={tmp_path / 'blank.jsonl'}"], "no documents"),
        ([f"--source={tmp_path / 'one.jsonl'}"], "too few"),
        (["--tokenizer=nonsense"], "unknown tokenizer"),
        ([f"--tokenizer={big_vocab}", "--dtype=uint16"], "cannot hold token ids up to 66047"),
    ]
    for flags, message in cases:
        with pytest.raises(SystemExit, match=message):
            run(tmp_path, *flags)
        assert not (tmp_path / "out").exists(), flags
    # the text field goes missing only in a later file, after shards were written: they are removed again
    docs = [{"text": d} for d in corpus()[:40]]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "b.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    monkeypatch.setattr(prep, "CHUNK_CHARS", 10_000)
    written, real_write_shard = [], prep.write_shard
    monkeypatch.setattr(prep, "write_shard", lambda *args: written.append(args[0]) or real_write_shard(*args))
    with pytest.raises(SystemExit, match="(?s)cannot read the input.*content"):
        run(tmp_path, f"--source={tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}", "--shard_tokens=1000")
    assert written and not (tmp_path / "out").exists()


def test_big_vocabulary_uses_uint32(tmp_path):
    path = write_two_byte_vocabulary(tmp_path / "tokenizer.model")
    meta, out_dir = run(tmp_path, f"--tokenizer={path}", "--val_every=10")
    assert meta["dtype"] == "uint32" and meta["tokenizer"]["bos_id"] == 65792
    ids = prep.read_shard(out_dir / meta["splits"]["val"]["shards"][0])
    assert ids.dtype == np.uint32 and ids[0] == 65792 and ids.max() > 65535


def test_out_dir_with_other_shards_is_refused(tmp_path, checkpoints):
    _, out_dir = run(tmp_path, "--val_every=10")
    before = shard_bytes(out_dir)
    with pytest.raises(SystemExit, match="different tokenizer"):
        run(tmp_path, f"--tokenizer={checkpoints['qwen_json'][0]}", "--val_every=10")
    with pytest.raises(SystemExit, match="different settings.*val_every"):
        run(tmp_path, "--val_every=20")
    assert shard_bytes(out_dir) == before
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "train.bin").write_bytes(b"x")
    with pytest.raises(SystemExit, match="no meta.json"):
        run(tmp_path, out="foreign")


@pytest.mark.parametrize("flag, message", [("--nmu_proc=2", "unrecognized arguments: --nmu_proc=2"),
                                           ("--num_proc=two", "invalid int value"),
                                           ("--val_every=1", "--val_every must be at least 2"),
                                           ("--dtype=int8", "invalid choice")])
def test_cli_rejects_bad_flags(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit):
        prep.main([f"--out_dir={tmp_path / 'out'}", flag])
    err = capsys.readouterr().err
    assert message in err and "--num_proc" in err and "--max_tokens" in err  # the usage lists the valid keys
    assert not (tmp_path / "out").exists()
