"""Tests for tokenizer.py: round trip, exact parity with Hugging Face `tokenizers` on tiny
tokenizers built here (helpers.py, and the fixtures checkpoints and layouts of conftest.py) and on
SmolLM2's."""
import base64
import builtins
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
from types import SimpleNamespace

import pytest
import tiktoken
from tokenizers import Regex, Tokenizer, pre_tokenizers, processors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lmkit.data_meta import TOKENIZER_FILES  # noqa: E402
from lmkit.errors import RunError  # noqa: E402
from lmkit.tokenizer import (FAMILIES, GPT2_DIGIT_RUNS_PATTERN, GPT2_DIGITS_PATTERN,
                             GPT2_PATTERN,  # noqa: E402
                             LLAMA3_PATTERN, QWEN2_PATTERN, encode_document, gpt2_unicode_to_byte,
                             llama3_special_tokens, load_tokenizer, tokenizer_info)
from helpers import (CODE, EOT, HF_LLAMA3_REGEX, HF_QWEN2_REGEX, POOL, SMOLLM2_LACKS,
                     TEXT,  # noqa: E402
                     byte_level, corpus, digits_then_gpt2, lossy_texts, lossy_tokenizer,
                     save_layout, split_then_bytes, write_json)


# -----------------------------------------------------------------------------
# Tokenizers


@pytest.mark.parametrize("kind", ["bytes", "llama_file", "llama", "qwen_json", "qwen_vocab"])
def test_round_trip(kind, checkpoints):
    spec = {"bytes": "bytes",
            "llama_file": str(checkpoints["llama"][0] / "original" / "tokenizer.model")}.get(kind)
    enc = load_tokenizer(spec or str(checkpoints[kind][0]))
    assert isinstance(enc, tiktoken.Encoding)
    for text in [TEXT, *corpus()[60:63]]:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        assert kind == "bytes" or len(ids) < len(text.encode()) * 0.8  # a real BPE merges


@pytest.mark.parametrize("kind", ["llama", "qwen_json", "qwen_vocab"])
def test_same_ids_as_hugging_face(kind, checkpoints):
    model_dir, hf = checkpoints[kind]
    enc = load_tokenizer(str(model_dir))
    assert enc.name == ("llama3" if kind == "llama" else "qwen2")  # picked from config.json
    texts = [TEXT, *corpus()[:3], *corpus()[40:79]]  # seen and unseen by the BPE trainer
    for text in texts:
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids
        assert enc.encode(text) == enc.encode_ordinary(text)
    # document boundaries use the teacher's special tokens, with the HF ids
    doc = encode_document(enc, "Hi there")
    if kind == "llama":
        assert (doc[0] == hf.token_to_id("<|begin_of_text|>")
                and doc[1:] == enc.encode_ordinary("Hi there"))
    else:
        assert (doc[-1] == hf.token_to_id("<|endoftext|>")
                and doc[:-1] == enc.encode_ordinary("Hi there"))


def test_qwen_normalises_to_nfc(checkpoints):
    model_dir, hf = checkpoints["qwen_json"]
    enc = load_tokenizer(str(model_dir))
    decomposed = unicodedata.normalize("NFD", "café naïve Ünïcödé Å ñ ")
    assert decomposed != unicodedata.normalize("NFC", decomposed)
    ids = enc.encode_ordinary(decomposed)
    assert (
        ids == hf.encode(decomposed).ids == enc.encode_ordinary(unicodedata.normalize("NFC",
                                                                                      decomposed)))
    # without NFC the ids would differ
    assert ids != tiktoken.Encoding.encode_ordinary(enc, decomposed)
    assert enc.encode(decomposed) == list(enc.encode_to_numpy(decomposed)) == ids


@pytest.mark.parametrize("pattern, hf_regex", [(LLAMA3_PATTERN, HF_LLAMA3_REGEX),
                                               (QWEN2_PATTERN, HF_QWEN2_REGEX)])
def test_pretokenizer_pattern_matches_hf(pattern, hf_regex):
    """tiktoken's regex engine must split text into the same pieces as the HF pre-tokenizer. An
    Encoding whose vocabulary holds every substring of the text encodes each piece as one token,
    which reveals the pieces."""
    text = TEXT + " don'T 123456789 a\u00a0b \u2003\n \n\t\n" + corpus()[0][:300]
    data = text.encode()
    substrings = {data[i:j] for i in range(len(data))
                  for j in range(i + 1, min(len(data), i + 40) + 1)}
    enc = tiktoken.Encoding("pieces", pat_str=pattern, special_tokens={},
                            mergeable_ranks={s: r for r,
                                             s in enumerate(sorted(substrings,
                                                                   key=lambda s: (len(s), s)))})
    pieces = [b.decode() for b in enc.decode_tokens_bytes(enc.encode_ordinary(text))]
    hf_pieces = [p for p,
                 _ in pre_tokenizers.Split(Regex(hf_regex),
                                           behavior="isolated").pre_tokenize_str(text)]
    assert pieces == hf_pieces
    assert any(p.isdigit() and len(p) == 3 for p in pieces) == (pattern == LLAMA3_PATTERN)


def test_llama3_special_tokens():
    specials = llama3_special_tokens(128000)
    assert len(specials) == 256 and sorted(specials.values()) == list(range(128000, 128256))
    assert specials["<|begin_of_text|>"] == 128000 and specials["<|end_of_text|>"] == 128001
    assert specials["<|eot_id|>"] == 128009


def test_bad_tokenizers(tmp_path, checkpoints):
    with pytest.raises(RunError, match="unknown tokenizer"):
        load_tokenizer("gpt-17")
    # a model directory without tokenizer files (config.json is not read for the tokenizer)
    write_json(tmp_path / "mistral" / "config.json", {"model_type": "mistral"})
    with pytest.raises(RunError, match="has no tokenizer.json, vocab.json \\+ merges.txt, or "
                                       "original/tokenizer"):
        load_tokenizer(str(tmp_path / "mistral"))
    (tmp_path / "sentencepiece.model").write_bytes(b"\n\x0f\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    with pytest.raises(RunError, match="not a tiktoken BPE file"):
        load_tokenizer(str(tmp_path / "sentencepiece.model"))
    # a vocabulary whose ids do not follow the merge order cannot be reproduced by tiktoken
    qwen_dir, hf = checkpoints["qwen_vocab"]
    vocab = hf.get_vocab(with_added_tokens=False)
    merges = (qwen_dir / "merges.txt").read_text().splitlines()[1:3]  # the first two merges
    first, second = (m.replace(" ", "") for m in merges)
    vocab[first], vocab[second] = vocab[second], vocab[first]
    write_json(tmp_path / "shuffled" / "config.json", {"model_type": "qwen2"})
    write_json(tmp_path / "shuffled" / "vocab.json", vocab)
    (tmp_path / "shuffled" / "merges.txt").write_text("\n".join(["#version: 0.2", *merges]))
    with pytest.raises(RunError, match="out of id order"):
        load_tokenizer(str(tmp_path / "shuffled"))
    # a directory without its EOS token cannot mark document ends (no tokenizer_class:
    # GPT2Tokenizer's defaults)
    (tmp_path / "shuffled" / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(RunError, match="eos_token '<\\|endoftext\\|>' is not one of its special "
                                       "tokens"):
        load_tokenizer(str(tmp_path / "shuffled"))


def test_the_loader_reads_only_the_files_meta_json_records(tmp_path, layouts, checkpoints,
                                                           monkeypatch):
    """Every file the directory loader opens or looks for, on each tokenizer directory the tests
    build, is one of TOKENIZER_FILES, whose sha256s meta.json records so that distill.py can check
    a teacher by them: the list cannot fall behind the loader. The directories cover every layout
    it reads: tokenizer.json (with special_tokens_map.json, or original/tokenizer.model beside it),
    vocab.json + merges.txt (with the legacy added_tokens.json), original/tokenizer.model alone."""
    legacy = tmp_path / "legacy"
    shutil.copytree(checkpoints["qwen_vocab"][0], legacy)
    config = json.loads((legacy / "tokenizer_config.json").read_text())
    write_json(legacy / "added_tokens.json", {t["content"]: int(i) for i, t
                                              in config.pop("added_tokens_decoder").items()})
    write_json(legacy / "tokenizer_config.json", config)
    directories = [*(d for d, *_ in layouts.values()), *(d for d, _ in checkpoints.values()),
                   legacy]
    opened, looked_for = [], []

    def recorded(real, paths):
        def call(path, *args, **kwargs):
            paths.append(os.fspath(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(builtins, "open", recorded(builtins.open, opened))
    monkeypatch.setattr(os.path, "isfile", recorded(os.path.isfile, looked_for))
    read = set()
    for model_dir in directories:
        opened.clear()
        looked_for.clear()
        load_tokenizer(str(model_dir))
        names = {what: {Path(path).relative_to(model_dir).as_posix() for path in paths
                        if Path(path) != model_dir}
                 for what, paths in (("opened", opened), ("looked for", looked_for))}
        assert names["opened"], model_dir
        for what, found in names.items():
            assert found <= set(TOKENIZER_FILES), (model_dir, what, found - set(TOKENIZER_FILES))
        read |= names["opened"]
    assert read == set(TOKENIZER_FILES)  # and each of them is read by some layout


# -----------------------------------------------------------------------------------------------
# Tokenizers read from their own files (any byte-level BPE directory), against the `tokenizers`
# library


def fuzz(seed, n=60):
    rng = random.Random(seed)
    return "".join(rng.choice(POOL) for _ in range(n))


def parity_texts():
    return [TEXT, CODE, unicodedata.normalize("NFD", TEXT), *corpus()[40:79],
            *(fuzz(seed) for seed in range(30))]


LAYOUTS = ["gpt2_no_config", "smollm_llama", "digit_runs", "qwen2_gpt2_regex", "llama3_json",
           "llama3_hub", "qwen25_inline", "bos_and_eos"]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_every_layout_gives_the_ids_of_tokenizers(kind, layouts):
    model_dir, hf, family, (before, after) = layouts[kind]
    enc = load_tokenizer(str(model_dir))
    assert enc.name == family
    for text in parity_texts():
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids, text
    # documents: wrapped as the tokenizer wraps a text (add_special_tokens=True), else EOS after
    # each
    text = fuzz(99)
    plain, wrapped = hf.encode(text, add_special_tokens=False).ids, hf.encode(text).ids
    doc = encode_document(enc, text)
    assert doc == [hf.token_to_id(t) for t in before] + plain + [hf.token_to_id(t) for t in after]
    assert doc == wrapped or (wrapped == plain and not before)
    info = tokenizer_info(enc, str(model_dir))
    assert (info["bos_id"], info["eos_id"]) == (hf.token_to_id(before[0]) if before else None,
                                                hf.token_to_id(after[0]) if after else None)


@pytest.mark.parametrize("pattern, pre_tokenizer", [
    (GPT2_PATTERN, byte_level()),
    (GPT2_DIGITS_PATTERN, digits_then_gpt2(True)),
    (GPT2_DIGIT_RUNS_PATTERN, digits_then_gpt2(False)),
    (LLAMA3_PATTERN, split_then_bytes(HF_LLAMA3_REGEX)),
    (QWEN2_PATTERN, split_then_bytes(HF_QWEN2_REGEX))],
                         ids=["gpt2", "digits", "digit_runs", "llama3", "qwen2"])
def test_pre_tokenizers_split_like_tokenizers(pattern, pre_tokenizer):
    """tiktoken with the pattern cuts fresh text into exactly the pieces of the `tokenizers`
    pre-tokenizer (a vocabulary of every substring makes each piece one token, which reveals the
    pieces)."""
    to_byte = gpt2_unicode_to_byte()
    for seed in range(40):
        text = fuzz(seed)
        data = text.encode()
        substrings = {data[i:j] for i in range(len(data))
                      for j in range(i + 1, min(len(data), i + 48) + 1)}
        enc = tiktoken.Encoding("pieces", pat_str=pattern, special_tokens={}, mergeable_ranks={
            s: r for r, s in enumerate(sorted(substrings, key=lambda s: (len(s), s)))})
        hf_pieces = [bytes(to_byte[c] for c in piece) for piece,
                     _ in pre_tokenizer.pre_tokenize_str(text)]
        assert enc.decode_tokens_bytes(enc.encode_ordinary(text)) == hf_pieces, text


def test_slow_tokenizers_match_transformers(tmp_path, layouts, checkpoints):
    """vocab.json + merges.txt only: GPT-2's conventions by default (<|endoftext|> inside
    vocab.json, as GPT-2's), Qwen2's for tokenizer_class Qwen2Tokenizer; the reference is
    transformers' tokenizer of the directory."""
    from transformers import GPT2Tokenizer, Qwen2Tokenizer
    hf = layouts["gpt2_no_config"][1]
    slow = tmp_path / "gpt2_slow"
    slow.mkdir()
    hf.model.save(str(slow))
    vocab = json.loads((slow / "vocab.json").read_text())
    write_json(slow / "vocab.json", vocab | {EOT: len(vocab)})
    for model_dir, cls in [(slow, GPT2Tokenizer), (checkpoints["qwen_vocab"][0], Qwen2Tokenizer)]:
        ref = cls.from_pretrained(str(model_dir))
        enc = load_tokenizer(str(model_dir))
        for text in parity_texts():
            assert enc.encode_ordinary(text) == ref(text,
                                                    add_special_tokens=False)["input_ids"], text
        # no BOS
        assert ref("Hi there")["input_ids"] == ref("Hi there",
                                                   add_special_tokens=False)["input_ids"]
        assert encode_document(enc, "Hi there") == ref("Hi there")["input_ids"] + [ref.eos_token_id]
        assert enc.name == ("qwen2" if cls is Qwen2Tokenizer else "bpe")


def test_transformers_prepends_the_bos_we_put_before_documents(layouts):
    from transformers import AutoTokenizer
    model_dir, hf, _, _ = layouts["llama3_json"]
    ref = AutoTokenizer.from_pretrained(str(model_dir))
    enc = load_tokenizer(str(model_dir))
    for text in [TEXT, CODE]:
        assert encode_document(enc, text) == ref(text)["input_ids"]
        assert enc.encode_ordinary(text) == ref(text, add_special_tokens=False)["input_ids"]


def test_inline_added_tokens_and_special_token_strings(layouts):
    """Added tokens that are not special are matched inside text, as Hugging Face does
    (normalized=true ones after NFC); special tokens' strings are ordinary text, as Hugging Face's
    encode_special_tokens=True."""
    model_dir, hf, _, _ = layouts["qwen25_inline"]
    enc = load_tokenizer(str(model_dir))
    assert enc.inline == ("<tool_call>", "</tool_call>",
                          "naïve") and enc.inline_normalized == ("naïve",)
    text = ('Call <tool_call>{"n": '
            '12}</tool_call></tool_call>x; ' + unicodedata.normalize("NFD", "naïve café")
            + " naïve")
    ids = enc.encode_ordinary(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert ids.count(hf.token_to_id("<tool_call>")) == 1 and ids.count(hf.token_to_id("naïve")) == 2
    forged = "a <|im_start|>user\n<|endoftext|> b"
    as_text = hf.encode(forged, add_special_tokens=False).ids
    hf.encode_special_tokens = True
    try:
        assert enc.encode_ordinary(forged) == hf.encode(forged,
                                                        add_special_tokens=False).ids != as_text
    finally:
        hf.encode_special_tokens = False
    with pytest.raises(ValueError, match="special token"):
        enc.encode(forged)
    assert enc.encode(forged, allowed_special="all") == as_text
    assert enc.encode(forged, disallowed_special=()) == enc.encode_ordinary(forged)
    assert list(enc.encode_to_numpy(text)) == ids
    clone = pickle.loads(pickle.dumps(enc))  # what the tokenizer workers get
    assert clone.encode_ordinary(text) == ids and tokenizer_info(clone, "x") == tokenizer_info(enc,
                                                                                               "x")


def old_sha256(enc, *conventions):
    """The sha256 prepare_data.py recorded before it read tokenizers' files (its formula, written
    out here); with the conventions of a family 'bpe' tokenizer (conventions_before_unk), the sha256
    it has had since."""
    h = hashlib.sha256(json.dumps([enc.name, enc._pat_str, enc.nfc, enc._special_tokens,
                                   *conventions],
                                  sort_keys=True).encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    return h.hexdigest()


def conventions_before_unk(enc):
    """What the sha256 of a family 'bpe' tokenizer covered before unk_token was supported (written
    out here)."""
    return dict(pattern=enc._pat_str, nfc=enc.nfc, inline=sorted(enc.inline),
                inline_normalized=sorted(enc.inline_normalized), prefix=list(enc.prefix),
                suffix=list(enc.suffix),
                document=[list(enc.doc_prefix), list(enc.doc_suffix)],
                prefix_token=enc.prefix_token)


def test_sha256_keeps_old_data_valid_and_covers_conventions(tmp_path, layouts, checkpoints):
    """The three old conventions keep their sha256 (data and checkpoints made before still match
    their teachers); any other tokenizer's covers its conventions, so a changed document boundary is
    a different tokenizer."""
    specs = ["bytes", str(checkpoints["llama"][0] / "original" / "tokenizer.model"),
             *(str(checkpoints[k][0]) for k in ("llama", "qwen_json", "qwen_vocab")),
             *(str(layouts[k][0]) for k in ("llama3_json", "llama3_hub"))]
    for spec in specs:
        enc = load_tokenizer(spec)
        assert enc.name in FAMILIES and tokenizer_info(enc, spec)["sha256"] == old_sha256(enc), spec
    sha = lambda spec: tokenizer_info(load_tokenizer(str(spec)), str(spec))["sha256"]
    # the same tokenizer, two layouts
    assert sha(layouts["llama3_hub"][0]) == sha(layouts["llama3_json"][0])
    plain = layouts["gpt2_no_config"][0]
    enc = load_tokenizer(str(plain))
    assert tokenizer_info(enc, str(plain))["sha256"] != old_sha256(enc)
    # the same vocabulary, pattern and specials, but <|endoftext|> put before every text: another
    # tokenizer
    hf = layouts["gpt2_no_config"][1]
    tok = Tokenizer.from_str(hf.to_str())
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A",
                                                       special_tokens=[(EOT, hf.token_to_id(EOT))])
    with_bos = save_layout(tmp_path / "with_bos", tok, tokenizer_config={"eos_token": EOT})
    assert encode_document(load_tokenizer(str(with_bos)), "x") == tok.encode("x").ids
    assert tok.encode("x").ids == [hf.token_to_id(EOT), *hf.encode("x").ids]
    assert sha(with_bos) != sha(plain)


# -----------------------------------------------------------------------------------------------
# Vocabularies without a token for every byte (SmolLM2's lacks 21, huggingface/smollm#81): Hugging
# Face's BPE drops those bytes and merges what is left of each piece. Tiny ones trained here, then
# the real SmolLM2 tokenizers.


def symbol_bytes(tokens):
    """The bytes that byte-level BPE tokens (as strings of byte-level symbols) stand for."""
    to_byte = gpt2_unicode_to_byte()
    return b"".join(bytes(to_byte[c] for c in token) for token in tokens)


@pytest.mark.parametrize("kind", ["gpt2", "smollm", "llama3"])
def test_bytes_the_vocabulary_lacks_are_dropped_as_tokenizers_does(kind, tmp_path):
    """A vocabulary without SmolLM2's 21 bytes and '!', under GPT-2's, SmolLM's and Llama-3's
    pre-tokenizers (in Llama-3's a dropped character may lead a word): the ids of `tokenizers`, and
    the count of dropped bytes."""
    pre_tokenizer = {"gpt2": byte_level(), "smollm": digits_then_gpt2(True),
                     "llama3": split_then_bytes(HF_LLAMA3_REGEX)}[kind]
    lacking = SMOLLM2_LACKS + b"!"
    hf = lossy_tokenizer(pre_tokenizer, lacking)
    enc = load_tokenizer(str(save_layout(tmp_path / kind, hf, tokenizer_config={"eos_token": EOT})))
    assert (enc.missing == bytes(sorted(lacking))
            and tokenizer_info(enc, "x")["missing_bytes"] == sorted(lacking))
    texts = lossy_texts()
    assert sum(enc.dropped_bytes(text) > 0 for text in texts) > 50
    for text in texts:
        ids = enc.encode_ordinary(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids, text
        kept = symbol_bytes(hf.encode(text, add_special_tokens=False).tokens)
        assert enc.decode_bytes(ids) == kept == text.encode().translate(None, lacking)
        assert enc.dropped_bytes(text) == len(text.encode()) - len(kept)
    # the rest of a piece merges across the dropped byte (a piece longer than the substrings
    # encode_lossy starts with)
    assert enc.encode_ordinary("=" * 40 + "\x14" + "=" * 40) == enc.encode_ordinary("=" * 80)


def bpe_variant(hf, directory, **model):
    """(`tokenizers` Tokenizer, directory): hf's tokenizer.json with these BPE model settings, saved
    as a tokenizer directory; special tokens' strings in text are text, as in encode_ordinary."""
    spec = json.loads(hf.to_str())
    tok = Tokenizer.from_str(json.dumps(spec | {"model": spec["model"] | model}))
    tok.encode_special_tokens = True
    return tok, str(save_layout(directory, tok, tokenizer_config={"eos_token": EOT}))


def test_byte_fallback_with_missing_bytes(tmp_path):
    """byte_fallback spells a symbol without a token as <0xNN> tokens: on a byte-level BPE without
    such tokens it never fires (accepted, the ids of `tokenizers`); with them it does (refused, as
    SentencePiece-style). A slow vocab.json + merges.txt lacking bytes: refused."""
    hf = lossy_tokenizer(byte_level())
    fallback, path = bpe_variant(hf, tmp_path / "fallback", byte_fallback=True)
    enc = load_tokenizer(path)
    for text in lossy_texts()[:40]:
        assert enc.encode_ordinary(text) == fallback.encode(text, add_special_tokens=False).ids == \
            hf.encode(text, add_special_tokens=False).ids
    # <0xC4> <0x84>: the UTF-8 of the byte-level symbol of byte 4 ('Ą'), what the fallback looks for
    vocab = hf.get_vocab(with_added_tokens=False)
    vocab |= {"<0xC4>": len(vocab), "<0x84>": len(vocab) + 1}
    fires, path = bpe_variant(hf, tmp_path / "fires", byte_fallback=True, vocab=vocab)
    assert fires.encode("a\x04").ids == [fires.token_to_id("a"), vocab["<0xC4>"], vocab["<0x84>"]]
    with pytest.raises(RunError, match="a SentencePiece-style BPE"):
        load_tokenizer(path)
    (tmp_path / "slow").mkdir()
    hf.model.save(str(tmp_path / "slow"))
    with pytest.raises(RunError, match="lacks 21 of the 256 single bytes.*depend on the "
                                       "transformers version"):
        load_tokenizer(str(tmp_path / "slow"))


# runs of several missing bytes: within one piece, and across two ('!' then 'q': two pieces for
# GPT-2's regex, one for Llama-3's, whose letters may follow one other character)
UNK_RUNS = ["\x04\x06\x13\x14\x16\x1d", "a\x04\x04\x04b", "\x04 \x06", "x\x04\U00040000\x06y", "!q",
            "x!q!y", "!!qq!!\x04q", "  \x1d\x1d\n\x13", "Q!q\x04!"]


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_unk_token_stands_for_the_bytes_the_vocabulary_lacks(kind, tmp_path):
    """A byte-level BPE without a token for every byte that declares an unk_token, as transformers
    4.57's GGUF converter writes SmolLM2's (unk_token <|endoftext|>, fuse_unk true, byte_fallback
    true; here with GPT-2's and Llama-3's pre-tokenizers, '!' and 'q' lacking too), and with
    fuse_unk false: the ids of `tokenizers` on the drop case's texts and on runs of missing bytes. A
    run within one piece is one unk when fused, one per byte if not."""
    pre_tokenizer = {"gpt2": byte_level(), "llama3": split_then_bytes(HF_LLAMA3_REGEX)}[kind]
    lacking = SMOLLM2_LACKS + b"!q"
    hf = lossy_tokenizer(pre_tokenizer, lacking)
    unk = hf.token_to_id(EOT)
    texts = [*lossy_texts(), *UNK_RUNS]
    encoded = {}
    for fuse in (True, False):
        tok, path = bpe_variant(hf, tmp_path / f"fuse_{fuse}", unk_token=EOT, fuse_unk=fuse,
                                byte_fallback=True)
        enc = load_tokenizer(path)
        assert enc.unk == (EOT, unk, fuse) and tokenizer_info(enc, path)["unk"] == [EOT, unk, fuse]
        encoded[fuse] = [enc.encode_ordinary(text) for text in texts]
        for text, ids in zip(texts, encoded[fuse]):
            assert ids == tok.encode(text, add_special_tokens=False).ids, (fuse, text)
            assert ids.count(unk) <= enc.dropped_bytes(text) == len(text.encode()) - len(
                text.encode().translate(None, lacking))
        assert enc.encode_ordinary("a\x04\x06\x13b") == [hf.token_to_id("a"),
                                                         *[unk] * (1 if fuse else 3),
                                                            hf.token_to_id("b")]
        assert enc.encode_ordinary("!q") == [unk] * (1 if fuse and kind == "llama3" else 2)
        # the unk, then <|endoftext|> ending the document
        assert encode_document(enc, "\x04") == [unk, unk]
    assert sum(fused != apart for fused, apart in zip(encoded[True], encoded[False])) > 20


def test_unk_token_refusals_and_sha256(tmp_path, layouts):
    """An unk_token outside the BPE vocabulary, or one that a merge joins to a neighbour, is refused
    in one line. A vocabulary with every byte never uses its unk_token: accepted as before, with the
    sha256 it had."""
    hf = lossy_tokenizer(byte_level())
    _, path = bpe_variant(hf, tmp_path / "absent", unk_token="<unk>")
    with pytest.raises(RunError, match=r"tokenizer.json: unk_token '<unk>' is not in the BPE "
                                       r"vocabulary"):
        load_tokenizer(path)
    first_merge = json.loads(hf.to_str())["model"]["merges"][0]
    left = first_merge.split(" ")[0] if isinstance(first_merge, str) else first_merge[0]
    _, path = bpe_variant(hf, tmp_path / "merged", unk_token=left)
    with pytest.raises(RunError, match=f"unk_token {re.escape(repr(left))} takes part in merge"):
        load_tokenizer(path)
    whole = layouts["gpt2_no_config"][1]  # every byte
    plain = load_tokenizer(str(layouts["gpt2_no_config"][0]))
    tok, path = bpe_variant(whole, tmp_path / "every_byte", unk_token=EOT, fuse_unk=True)
    enc = load_tokenizer(path)
    assert enc.unk is None and tokenizer_info(enc, path)["sha256"] == tokenizer_info(plain,
                                                                                     path)["sha256"]
    for enc in (enc,
                load_tokenizer(str(save_layout(tmp_path / "drops", hf,
                                               tokenizer_config={"eos_token": EOT})))):
        assert tokenizer_info(enc, "x")["sha256"] == old_sha256(enc, conventions_before_unk(enc))


CHAT = ("<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12+30?<|im_end|>\n")


@pytest.mark.parametrize("flavour", ["hub", "gguf"])
def test_smollm2_tokenizers_give_the_ids_of_transformers(flavour, smollm2):
    """The real SmolLM2-135M-Instruct tokenizers (tests/conftest.py): SmolLM2's hub tokenizer
    rebuilt from the GGUF, and transformers' conversion of the GGUF's (no digit splitting). Each
    gives the ids of transformers' AutoTokenizer on its own directory, text with the bytes its
    vocabulary lacks included; documents end with <|im_end|>; chat markup is text in documents and
    special tokens where allowed."""
    from transformers import AutoTokenizer
    model_dir = str(smollm2[flavour])
    enc, ref = load_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert enc.missing == SMOLLM2_LACKS and enc.n_vocab == 49152
    info = tokenizer_info(enc, model_dir)
    assert (info["bos_id"], info["eos_id"], info["eos_token"]) == (None, 2, "<|im_end|>") == (
        None, ref.eos_token_id, ref.eos_token)
    assert info["boundary"].startswith("<|im_end|> after each document")
    texts = [CHAT, *lossy_texts()]
    for text in texts:
        # nothing put around a text
        assert ref(text)["input_ids"] == ref(text, add_special_tokens=False)["input_ids"]
        assert enc.encode(text, allowed_special="all") == ref(text)["input_ids"], text
        plain = ref(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert encode_document(enc, text) == plain + [ref.eos_token_id], text
        assert (enc.dropped_bytes(text)
                == len(text.encode()) - len(symbol_bytes(ref.convert_ids_to_tokens(plain))))
    assert sum(enc.dropped_bytes(text) > 0 for text in texts) > 50
    assert enc.encode(CHAT,
                      allowed_special="all").count(ref.convert_tokens_to_ids("<|im_start|>")) == 2


def test_the_two_smollm2_tokenizers_differ_in_pre_tokenization(smollm2):
    """One vocabulary, two tokenizers: the hub's pre-tokenizer cuts text before every digit (a
    whitespace run before one stays whole), transformers' GGUF conversion does not; data prepared
    with one is not the other's."""
    hub, gguf = load_tokenizer(str(smollm2["hub"])), load_tokenizer(str(smollm2["gguf"]))
    assert (hub._mergeable_ranks == gguf._mergeable_ranks
            and hub._special_tokens == gguf._special_tokens)
    assert tokenizer_info(hub, "x")["sha256"] != tokenizer_info(gguf, "x")["sha256"]
    assert hub.decode_tokens_bytes(hub.encode_ordinary("x  1")) == [b"x", b"  ", b"1"]
    assert gguf.decode_tokens_bytes(gguf.encode_ordinary("x  1")) == [b"x", b" ", b" ", b"1"]


def test_the_bench_tokenizes_with_both_libraries_and_the_ids_are_equal(capsys):
    """tools/bench.py's tokenizer section at a tiny size: prepare_data.py run on the rebuild and on
    `tokenizers` (encode_batch, in spawned workers at --num_proc=2) writes the same shards, or the
    section raises. Its timings are not checked."""
    from tools.tokenizer_bench import bench_tokenizer
    bench_tokenizer(SimpleNamespace(tokenizer_styles=["smollm"], tokenizer_vocab=400,
                                    tokenizer_every=300, tokenizer_repeats=1), None)
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| smollm")]
    assert [(row[1], row[-1]) for row in rows] == [("1", "yes |"), ("2", "yes |")]
