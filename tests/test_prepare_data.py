"""Tests for prepare_data.py: tokenizers (round trip, exact parity with Hugging Face `tokenizers` on tiny
tokenizers built here), shard files, the CLI pipeline (determinism, resume, bad input)."""
import base64
import json
import os
import re
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

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
    # Qwen as tokenizer.json ...
    write_json(root / "qwen_json" / "config.json", {"model_type": "qwen2"})
    qwen.save(str(root / "qwen_json" / "tokenizer.json"))
    # ... and as vocab.json + merges.txt, with the special tokens in tokenizer_config.json (as Qwen1.5 ships them)
    write_json(root / "qwen_vocab" / "config.json", {"model_type": "qwen2"})
    qwen.model.save(str(root / "qwen_vocab"))
    added = {str(qwen.token_to_id(t)): {"content": t, "special": True}
             for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
    write_json(root / "qwen_vocab" / "tokenizer_config.json", {"added_tokens_decoder": added})
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
    write_json(tmp_path / "mistral" / "config.json", {"model_type": "mistral"})
    with pytest.raises(SystemExit, match="model_type 'mistral'"):
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
    # a Qwen directory without <|endoftext|> cannot mark document ends
    (tmp_path / "shuffled" / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(SystemExit, match="has no <\\|endoftext\\|> token"):
        prep.load_tokenizer(str(tmp_path / "shuffled"))

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
