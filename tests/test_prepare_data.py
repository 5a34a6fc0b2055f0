"""Tests for prepare_data.py, the command line: tokenizers through it, the pipeline (layout, file
formats, determinism, resume) and bad input."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import prepare_data as prep  # noqa: E402
from lmkit.data import Windows  # noqa: E402
from prepare_data import read_shard  # noqa: E402
from lmkit.data_meta import check_meta, tokenizer_files  # noqa: E402
from lmkit.errors import RunError  # noqa: E402
from lmkit.tokenizer import QWEN2_PATTERN, load_tokenizer, tokenizer_info  # noqa: E402
from helpers import (EOT, SMOLLM2_LACKS, byte_level, corpus, flip_byte, lossy_fuzz,
                     lossy_tokenizer,  # noqa: E402
                     save_layout, write_json, write_tiktoken_file)


def write_two_byte_vocabulary(path):
    """A tiktoken file with every byte and every pair of bytes: 65,792 ranks, so ids beyond
    uint16."""
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    write_tiktoken_file(path,
                        {t: r for r, t in enumerate([bytes([a]) for a in range(256)] + pairs)})
    return path


def run(tmp_path, *flags, out="out"):
    out_dir = tmp_path / out
    return prep.main([f"--out_dir={out_dir}", "--num_proc=1", *flags]), out_dir


def split_docs(out_dir, split):
    """The documents of one split of a bytes-tokenized out_dir (each ends with <|endoftext|> =
    256)."""
    meta = json.loads((out_dir / "meta.json").read_text())
    ids = np.concatenate([read_shard(out_dir / name) for name in meta["splits"][split]["shards"]])
    assert ids[-1] == 256
    ends = np.flatnonzero(ids == 256)
    return [bytes(ids[start:end].astype(np.uint8)).decode() for start,
            end in zip([0, *(ends[:-1] + 1)], ends)]


def shard_bytes(out_dir):
    return {p.name: p.read_bytes() for p in sorted(out_dir.glob("*.bin"))}


def test_public_entry_points(tmp_path):
    """Code written against prepare_data.py keeps working: its tokenizer is tokenizer.py's, and
    read_shard gives back the ids write_shard wrote, read-only, refusing a damaged header."""
    assert prep.load_tokenizer is load_tokenizer
    path = tmp_path / "train_000000.bin"
    prep.write_shard(str(path), [np.arange(5), np.array([70_000, 3])], "uint32")
    ids = prep.read_shard(path)
    assert ids.tolist() == [0, 1, 2, 3, 4, 70_000, 3] and not ids.flags.writeable
    path.write_bytes(b"NOTASHRD" + path.read_bytes()[8:])
    with pytest.raises(RunError, match="not a token shard"):
        prep.read_shard(path)

# -----------------------------------------------------------------------------
# Tokenizers read from their own files, through the command line


def test_issue_14_regressions(tmp_path, layouts):
    """(1) a tokenizer directory without config.json, (2) a Llama model with a GPT-2-style BPE and
    <|endoftext|> (SmolLM's shape), (3) a qwen2 model whose tokenizer.json uses GPT-2's regex: each
    prepared exactly."""
    docs = corpus()[:12]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    for kind in ("gpt2_no_config", "smollm_llama", "qwen2_gpt2_regex"):
        model_dir, hf, _, _ = layouts[kind]
        assert (model_dir / "config.json").exists() == (kind != "gpt2_no_config")
        meta, out_dir = run(tmp_path, f"--source={src}", f"--tokenizer={model_dir}",
                            "--val_every=4", out=kind)
        eot = hf.token_to_id(EOT)
        val = np.concatenate([read_shard(out_dir / n)
                              for n in meta["splits"]["val"]["shards"]]).tolist()
        assert val == [i for d in docs[::4] for i in hf.encode(d, add_special_tokens=False).ids
                       + [eot]]
        tok = meta["tokenizer"]
        assert (tok["family"], tok["bos_id"], tok["eos_id"], tok["eos_token"]) == ("bpe", None, eot,
                                                                                   EOT)
        assert (tok["boundary"].startswith("<|endoftext|> after each document")
                and tok["prefix"] == tok["suffix"] == [])
    # (3): " 100" is one GPT-2 piece but three Qwen2 pieces; the ids are the model's own tokenizer's
    model_dir, hf, _, _ = layouts["qwen2_gpt2_regex"]
    enc = load_tokenizer(str(model_dir))
    qwen_regex = tiktoken.Encoding("q", pat_str=QWEN2_PATTERN, mergeable_ranks=enc._mergeable_ranks,
                                   special_tokens={})
    for text in [" 100", "In 1999, 42 of 1234567 people paid $3.50."]:
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids
        assert enc.encode_ordinary(text) != qwen_regex.encode_ordinary(text)


@pytest.mark.parametrize("name", ["tiny", "hub", "gguf"])
def test_bytes_the_vocabulary_lacks(name, tmp_path, request):
    """A vocabulary without every byte (a tiny one trained here; the real SmolLM2 tokenizers: the
    hub's rebuilt from the GGUF, and transformers' conversion): the shards hold the ids of the
    `tokenizers` library / transformers, <|endoftext|> / <|im_end|> after each document as the files
    declare, and meta.json counts the bytes dropped."""
    if name == "tiny":
        hf = lossy_tokenizer(byte_level())
        model_dir = save_layout(tmp_path / "tiny", hf, tokenizer_config={"eos_token": EOT})
        encode, eos = (lambda d: hf.encode(d, add_special_tokens=False).ids), hf.token_to_id(EOT)
    else:
        from transformers import AutoTokenizer
        model_dir = request.getfixturevalue("smollm2")[name]
        ref = AutoTokenizer.from_pretrained(str(model_dir))
        encode, eos = (lambda d: ref(d, split_special_tokens=True)["input_ids"]), ref.eos_token_id
    docs = [*corpus()[:6], *(lossy_fuzz(seed) for seed in range(30))]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    meta, out_dir = run(tmp_path, f"--source={src}", f"--tokenizer={model_dir}", "--val_every=3")
    lacking = SMOLLM2_LACKS
    for split, split_docs_ in (("train", [d for i, d in enumerate(docs) if i % 3]),
                               ("val", docs[::3])):
        ids = np.concatenate([read_shard(out_dir / n)
                              for n in meta["splits"][split]["shards"]]).tolist()
        assert ids == [i for d in split_docs_ for i in encode(d) + [eos]], split
        dropped = sum(len(d.encode()) - len(d.encode().translate(None, lacking))
                      for d in split_docs_)
        assert meta["splits"][split]["dropped_bytes"] == dropped > 0, split
    tok = meta["tokenizer"]
    assert tok["missing_bytes"] == list(lacking) and tok["eos_id"] == eos and tok["bos_id"] is None
    assert tok["boundary"].startswith(f"{EOT if name == 'tiny' else '<|im_end|>'} after each "
                                      "document")


def refusal_cases(root, layouts):
    """name -> (directory, the message it is refused with)."""
    gpt2_dir, gpt2, _, _ = layouts["gpt2_no_config"]
    cases = {}

    def variant(name, message, tok=None, tokenizer_config=None, **files):
        cases[name] = (save_layout(root / name, tok or gpt2, tokenizer_config=tokenizer_config,
                                   **files), message)

    def trained(model, pre_tokenizer, trainer):
        tok = Tokenizer(model)
        tok.pre_tokenizer = pre_tokenizer
        tok.train_from_iterator(corpus()[:5], trainer)
        return tok

    eos = {"eos_token": EOT}
    (root / "sentencepiece").mkdir(parents=True)
    (
        root / "sentencepiece" / "tokenizer.model").write_bytes(
        b"\n\x0f\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    write_json(root / "sentencepiece" / "config.json", {"model_type": "mistral"})
    cases["sentencepiece"] = (root / "sentencepiece",
                              "has tokenizer.model but no tokenizer.json.*only byte-level BPE")
    variant("sentencepiece_json", "a SentencePiece-style BPE.*only byte-level BPE", trained(
        models.BPE(unk_token="<unk>", byte_fallback=True), pre_tokenizers.Metaspace(),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)), eos)
    variant("wordpiece", "a WordPiece model; only byte-level BPE", trained(
        models.WordPiece(unk_token="[UNK]"), pre_tokenizers.BertPreTokenizer(),
        trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False)),
            eos)
    variant("unigram", "a Unigram model; only byte-level BPE",
            trained(models.Unigram(), pre_tokenizers.Metaspace(),
                    trainers.UnigramTrainer(vocab_size=100, show_progress=False)), eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.normalizer = normalizers.NFKC()
    variant("nfkc", "normalizer NFKC is not supported", tok, eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    variant("lowercase", r"normalizer NFC \+ Lowercase is not supported", tok, eos)
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), byte_level()])
    variant("whitespace_split", r"pre-tokenizer WhitespaceSplit\(\) \+ ByteLevel\(use_regex=True\) "
                                r"is not supported",
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
            tokenizer_config={"tokenizer_class": "LlamaTokenizerFast", "bos_token": EOT,
                              "eos_token": EOT})
    tok = Tokenizer.from_str(gpt2.to_str())
    tok.add_tokens([AddedToken("<tool>", special=False, lstrip=True)])
    variant("lstrip", "added token '<tool>' has lstrip", tok, eos)
    shutil.copytree(layouts["llama3_hub"][0], root / "two_vocabularies")
    write_tiktoken_file(root / "two_vocabularies" / "original" / "tokenizer.model",
                        {bytes([b]): b for b in range(256)})
    cases["two_vocabularies"] = (root / "two_vocabularies",
                                 "original/tokenizer.model and tokenizer.json hold different "
                                 "vocabularies")
    (root / "slow_codegen").mkdir()
    gpt2.model.save(str(root / "slow_codegen"))
    write_json(root / "slow_codegen" / "tokenizer_config.json",
               {"tokenizer_class": "CodeGenTokenizer"} | eos)
    cases["slow_codegen"] = (root / "slow_codegen",
                             "tokenizer_class 'CodeGenTokenizer'.*supported without a "
                             "tokenizer.json: GPT2Tokenizer")
    (root / "empty").mkdir()
    cases["empty"] = (root / "empty", "has no tokenizer.json, vocab.json \\+ merges.txt, or "
                                      "original/tokenizer.model")
    assert gpt2_dir.is_dir()
    return cases


def test_unsupported_tokenizers_are_refused_before_anything_is_written(tmp_path, layouts):
    for name, (model_dir, message) in refusal_cases(tmp_path / "dirs", layouts).items():
        with pytest.raises(RunError, match=message):
            load_tokenizer(str(model_dir))
        with pytest.raises(RunError, match=message):
            run(tmp_path, f"--tokenizer={model_dir}", out=name)
        assert not (tmp_path / name).exists(), name

# -----------------------------------------------------------------------------
# The pipeline


def test_builtin_bytes_layout_and_meta(tmp_path):
    meta, out_dir = run(tmp_path, "--source=builtin", "--tokenizer=bytes", "--val_every=10")
    docs = corpus()
    assert split_docs(out_dir, "val") == docs[::10]  # held-out whole documents 0, 10, 20, ...
    assert split_docs(out_dir, "train") == [d for i, d in enumerate(docs) if i % 10]
    on_disk = json.loads((out_dir / "meta.json").read_text())
    assert on_disk == meta and meta["complete"]
    assert (meta["dtype"] == "uint16" and meta["vocab_size"] == 257
            and meta["tokenizer"]["eos_id"] == 256)
    assert meta["splits"]["val"]["documents"] == 8 and meta["splits"]["train"]["documents"] == 71
    assert meta["splits"]["train"]["tokens"] == sum(len(d.encode()) + 1 for i, d in enumerate(docs)
                                                    if i % 10)
    assert "--source=builtin" in meta["command"]
    enc = load_tokenizer(meta["tokenizer"]["spec"])  # the spec rebuilds the same tokenizer
    assert tokenizer_info(enc, "bytes")["sha256"] == meta["tokenizer"]["sha256"]
    # running again on a complete directory does nothing
    before = shard_bytes(out_dir)
    run(tmp_path, "--source=builtin", "--tokenizer=bytes", "--val_every=10")
    assert shard_bytes(out_dir) == before


def test_llama_checkpoint_shards(tmp_path, checkpoints):
    model_dir, hf = checkpoints["llama"]
    src = tmp_path / "docs.jsonl"
    docs = corpus()[:30]
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    meta, out_dir = run(tmp_path, f"--source={src}", f"--tokenizer={model_dir}",
                        "--text_field=body", "--val_every=5")
    bos = hf.token_to_id("<|begin_of_text|>")
    val = np.concatenate([read_shard(out_dir / n)
                          for n in meta["splits"]["val"]["shards"]]).tolist()
    # <|begin_of_text|> before each document
    assert val == [i for d in docs[::5] for i in [bos] + hf.encode(d).ids]
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
        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}),
                       tmp_path / "d.parquet", row_group_size=4)
        flags = [f"--source={tmp_path / 'd.parquet'}"]
    meta, out_dir = run(tmp_path, *flags, "--val_every=4")
    assert split_docs(out_dir, "val") == docs[::4]
    assert split_docs(out_dir, "train") == [d for i, d in enumerate(docs) if i % 4]


def test_fineweb_edu_is_streamed_and_stops_at_max_tokens(tmp_path, monkeypatch):
    import datasets
    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return datasets.Dataset.from_dict({"text": corpus(),
                                           "url": ["x"] * 79}).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(prep, "CHUNK_CHARS", 100_000)
    meta, out_dir = run(tmp_path, "--source=fineweb-edu", "--fineweb_config=sample-100BT",
                        "--max_tokens=250000", "--shard_tokens=50000")
    assert calls == [("HuggingFaceFW/fineweb-edu",
                      dict(name="sample-100BT", split="train", streaming=True))]
    train = meta["splits"]["train"]
    assert train["tokens"] == 250_000 == sum(len(read_shard(out_dir / n)) for n in train["shards"])
    assert len(train["shards"]) >= 2
    lengths = [len(d.encode()) + 1 for i, d in enumerate(corpus()) if i % 100]
    # the last one is cut
    assert train["documents"] == int(np.searchsorted(np.cumsum(lengths), 250_000) + 1)


def test_output_does_not_depend_on_num_proc(tmp_path, monkeypatch, checkpoints):
    # many chunks, so that two workers really interleave
    monkeypatch.setattr(prep, "CHUNK_CHARS", 30_000)
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

    # an "array" whose data cannot be read: the process dies in the middle of writing a shard
    class Crash:
        def __len__(self):
            return 1000

        def __array__(self, dtype=None, copy=None):
            raise KeyboardInterrupt

    def dying_write_shard(path, arrays, dtype):  # the 4th shard dies half-written
        writes.append(os.path.basename(path))
        return real_write_shard(path, [*arrays, Crash()] if len(writes) == 4 else arrays, dtype)

    monkeypatch.setattr(prep, "write_shard", dying_write_shard)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, *flags)
    out_dir = tmp_path / "out"
    crashed = json.loads((out_dir / "meta.json").read_text())
    assert writes == ["train_000000.bin", "val_000000.bin", "train_000001.bin", "val_000001.bin"]
    assert (not crashed["complete"] and crashed["progress"]["shards"] == 1
            and crashed["progress"]["documents_read"] > 0)
    finished = {n: (out_dir / n).stat().st_mtime_ns for n in ["train_000000.bin", "val_000000.bin"]}
    # written, but not yet recorded in meta.json: redone on resume
    assert (out_dir / "train_000001.bin").exists()
    assert not (out_dir / "val_000001.bin").exists()
    # an interrupted write removes its temporary file ...
    assert not (out_dir / "val_000001.bin.tmp").exists()
    # ... a killed process leaves it half-written
    (out_dir / "val_000001.bin.tmp").write_bytes(b"ASASHARD" + bytes(9))

    monkeypatch.setattr(prep, "write_shard", real_write_shard)
    tokenized, real_tokenize_chunk = [], prep.tokenize_chunk
    monkeypatch.setattr(prep, "tokenize_chunk", lambda docs: tokenized.extend(docs)
                        or real_tokenize_chunk(docs))
    meta, _ = run(tmp_path, *flags)
    assert meta["complete"]
    # only the documents after the finished shards were read and tokenized again
    assert [text for _, text in tokenized] == corpus()[crashed["progress"]["documents_read"]:]
    # finished shards untouched
    assert {n: (out_dir / n).stat().st_mtime_ns for n in finished} == finished
    assert shard_bytes(out_dir) == shard_bytes(reference)
    assert not list(out_dir.glob("*.tmp"))


# -----------------------------------------------------------------------------------------------
# Checked data: each shard's checksum in meta.json, checked before training on it; damage rebuilt by
# a re-run


def test_damaged_and_deleted_shards_are_refused_by_name_and_rebuilt(tmp_path, monkeypatch, capsys):
    """A flipped byte (an id still below the vocabulary size: only the checksum sees it) or a
    deleted shard is refused in one line naming the shard by every reader (training's windows,
    train.py before it writes anything, eval_zeroshot's held-out task); re-running the same
    prepare_data.py command rebuilds the same bytes."""
    from lmkit import zeroshot
    import train
    from helpers import tiny_args
    monkeypatch.setattr(prep, "CHUNK_CHARS", 30_000)
    flags = ["--source=builtin", "--tokenizer=bytes", "--val_every=7", "--shard_tokens=100000"]
    meta, out_dir = run(tmp_path, *flags)
    before = shard_bytes(out_dir)
    assert len(meta["splits"]["train"]["shards"]) >= 2 and len(meta["splits"]["val"]["shards"]) >= 2
    assert meta["checksums"] == {name: f"crc32:{zlib.crc32(data):08x}" for name,
                                 data in before.items()}
    train_shard, val_shard = out_dir / "train_000001.bin", out_dir / "val_000000.bin"
    damaged = (f"^{re.escape(str(train_shard))}: damaged: its CRC-32 is "
               f"{zlib.crc32(flip_byte(train_shard, 1000)):08x}, ")
    fix = ("; re-run the prepare_data.py command recorded in meta.json: it rebuilds missing and "
           "damaged shards$")
    with pytest.raises(RunError, match=damaged
                       + f"but meta.json recorded {meta['checksums'][train_shard.name]} when it "
                         f"was written{fix}"):
        Windows(str(out_dir), "train", 32)
    with pytest.raises(RunError, match=damaged):
        train.main(tiny_args(out_dir, tmp_path / "run", "--max_iters=2"))
    assert not (tmp_path / "run").exists()
    flip_byte(val_shard, 30)
    with pytest.raises(RunError, match=f"^{re.escape(str(val_shard))}: damaged: "):
        zeroshot.heldout_rows(str(out_dir), 4)
    (out_dir / "train_000000.bin").unlink()
    with pytest.raises(RunError, match=f"^{re.escape(str(out_dir / 'train_000000.bin'))}: missing "
                                       f"\\(meta.json lists it\\){fix}"):
        Windows(str(out_dir), "train", 32)
    capsys.readouterr()
    run(tmp_path, *flags)
    assert (capsys.readouterr().err.startswith(f"note: {out_dir / 'train_000000.bin'}: missing "
                                               f"(meta.json lists it): rebuilding {out_dir}, "
                                               "reading --source again from the start\n"))
    assert (shard_bytes(out_dir) == before
            and json.loads((out_dir / "meta.json").read_text()) == meta)
    run(tmp_path, *flags)
    assert capsys.readouterr().out == (f"{out_dir} is already complete "
                                       f"({meta['splits']['train']['tokens']:,} train tokens); its "
                                       f"{len(before)} shards are whole\n")


def test_data_prepared_before_checksums_keeps_working(tmp_path, capsys):
    """A meta.json without checksums (written before they were recorded) is read with one note, once
    per process; the ids are still checked against the vocabulary size; the checksums are not part
    of the data's fingerprint, so checkpoints made on such data resume; re-running prepare_data.py
    finds it complete, or rebuilds it (with checksums) where a shard is damaged."""
    from lmkit import runs
    flags = ["--source=builtin", "--tokenizer=bytes", "--val_every=10"]
    meta, out_dir = run(tmp_path, *flags)
    before = shard_bytes(out_dir)
    old = {key: value for key, value in meta.items() if key != "checksums"}
    (out_dir / "meta.json").write_text(json.dumps(old))
    assert runs.data_fingerprint(old) == runs.data_fingerprint(meta)
    capsys.readouterr()
    for split in ("train", "val", "train"):
        Windows(str(out_dir), split, 32)
    assert capsys.readouterr().err == (
        f"note: {out_dir / 'meta.json'} records no checksum for 2 shard(s) (data prepared before "
        "checksums were recorded): they are checked for ids below the vocabulary size only; "
        "prepare the data again into a new --out_dir to have them checked in full\n")
    run(tmp_path, *flags)
    assert "shards are whole (2 without a checksum" in capsys.readouterr().out
    shard = out_dir / "train_000000.bin"
    token = int(np.frombuffer(before[shard.name], "<u2", offset=24)[10])
    flip_byte(shard, 24 + 2 * 10 + 1)  # the high byte of token 11: its id + 256, beyond the 257 ids
    with pytest.raises(RunError, match=f"^{re.escape(str(shard))}: token 11 \\(counting from 1\\) "
                                       f"is id {token + 256}, not below the vocabulary size 257 "
                                       "\\(meta.json\\): the shard is damaged; re-run the "
                                       "prepare_data.py command"):
        Windows(str(out_dir), "train", 32)
    rebuilt, _ = run(tmp_path, *flags)
    assert shard_bytes(out_dir) == before and rebuilt == meta


# -----------------------------------------------------------------------------
# The tokenizer's files in meta.json, against which distill.py checks a Hugging Face teacher


def copy_with_one_byte_more(model_dir, copy):
    """A copy of a tokenizer directory whose tokenizer_config.json ends in one more byte (a space):
    the same tokenizer, from other files."""
    shutil.copytree(model_dir, copy)
    with open(copy / "tokenizer_config.json", "a") as f:
        f.write(" ")
    return copy


def test_the_tokenizer_files_are_recorded_and_added_for_the_same_tokenizer(tmp_path, checkpoints,
                                                                           capsys):
    """A fresh run records the sha256 of each file of its --tokenizer directory (none for bytes).
    Run again on the complete out_dir with another copy of the same tokenizer, or on data prepared
    before the record existed, it adds that directory's files, says so in one line and leaves the
    shards and the rest of meta.json as they were; files already recorded are not added twice."""
    model_dir = checkpoints["qwen_json"][0]
    flags = ["--source=builtin", "--val_every=10"]
    meta, out_dir = run(tmp_path, *flags, f"--tokenizer={model_dir}")
    assert meta["tokenizer"]["files"] == [tokenizer_files(model_dir)]
    assert sorted(meta["tokenizer"]["files"][0]) == ["tokenizer.json", "tokenizer_config.json"]
    before, copy = shard_bytes(out_dir), copy_with_one_byte_more(model_dir, tmp_path / "copy")
    assert tokenizer_files(copy) != tokenizer_files(model_dir)
    capsys.readouterr()
    run(tmp_path, *flags, f"--tokenizer={copy}")
    added = (f"{out_dir}: recorded the files of --tokenizer={copy} in meta.json (the tokenizer the "
             "data was prepared with, by its sha256), so distill.py accepts it as a teacher\n")
    assert capsys.readouterr().out.startswith(added)
    on_disk = json.loads((out_dir / "meta.json").read_text())
    assert on_disk["tokenizer"].pop("files") == [tokenizer_files(model_dir), tokenizer_files(copy)]
    assert on_disk == {**meta, "tokenizer": {k: v for k, v in meta["tokenizer"].items()
                                             if k != "files"}}
    assert shard_bytes(out_dir) == before
    for spec in (model_dir, copy):  # known already: nothing is added or written
        run(tmp_path, *flags, f"--tokenizer={spec}")
        assert "recorded the files" not in capsys.readouterr().out
    (out_dir / "meta.json").write_text(json.dumps(on_disk))  # data prepared before the record
    run(tmp_path, *flags, f"--tokenizer={model_dir}")
    assert "recorded the files" in capsys.readouterr().out
    assert json.loads((out_dir / "meta.json").read_text()) == meta
    assert shard_bytes(out_dir) == before
    bytes_meta, _ = run(tmp_path, *flags, "--tokenizer=bytes", out="bytes")
    assert bytes_meta["tokenizer"]["files"] == []


def test_a_resumed_run_adds_the_tokenizer_files(tmp_path, checkpoints, monkeypatch, capsys):
    """A run that stopped part of the way, resumed with another copy of its tokenizer, records that
    copy's files too and ends with the shards of an uninterrupted run."""
    model_dir = checkpoints["qwen_json"][0]
    monkeypatch.setattr(prep, "CHUNK_CHARS", 30_000)
    flags = ["--source=builtin", "--val_every=7", "--shard_tokens=20000"]
    _, reference = run(tmp_path, *flags, f"--tokenizer={model_dir}", out="reference")
    real_write_shard, writes = prep.write_shard, []

    def dying_write_shard(path, arrays, dtype):  # the first shard pair is whole, then it dies
        writes.append(path)
        if len(writes) == 3:
            raise KeyboardInterrupt
        return real_write_shard(path, arrays, dtype)

    monkeypatch.setattr(prep, "write_shard", dying_write_shard)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, *flags, f"--tokenizer={model_dir}")
    monkeypatch.setattr(prep, "write_shard", real_write_shard)
    out_dir, copy = tmp_path / "out", copy_with_one_byte_more(model_dir, tmp_path / "copy")
    assert json.loads((out_dir / "meta.json").read_text())["progress"]["shards"] == 1
    capsys.readouterr()
    meta, _ = run(tmp_path, *flags, f"--tokenizer={copy}")
    assert f"recorded the files of --tokenizer={copy}" in capsys.readouterr().out
    assert meta["complete"] and meta["tokenizer"]["files"] == [tokenizer_files(model_dir),
                                                               tokenizer_files(copy)]
    assert shard_bytes(out_dir) == shard_bytes(reference)


def test_the_tokenizer_files_field_is_type_checked(tmp_path):
    """meta.json's tokenizer.files must be a list of objects where present; data prepared before it
    existed, without it, reads."""
    meta, _ = run(tmp_path, "--source=builtin", "--val_every=10")
    for files, message in [("x", "tokenizer.files is 'x' (a string), where prepare_data.py writes "
                                 "a list"),
                           (["x"], "an element of tokenizer.files is 'x' (a string), where "
                                   "prepare_data.py writes an object")]:
        with pytest.raises(RunError, match=re.escape(f"meta.json: {message}: the file was edited")):
            check_meta(dict(meta, tokenizer=dict(meta["tokenizer"], files=files)), "meta.json")
    older = dict(meta, tokenizer={k: v for k, v in meta["tokenizer"].items() if k != "files"})
    assert check_meta(older, "meta.json") is older


# -----------------------------------------------------------------------------
# Bad input: a clear error (RunError with a message) and no output directory


def test_bad_input_leaves_no_output(tmp_path, monkeypatch, checkpoints):
    (tmp_path / "content.jsonl").write_text(json.dumps({"content": "hello"}) + "\n")
    (tmp_path / "empty.txt").write_text("")
    # datasets' json builder alone stops with a bare StopIteration
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "line.txt").write_text("a line")
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "just one document"}) + "\n")
    (tmp_path / "notes.md").write_text("# hi")
    big_vocab = write_two_byte_vocabulary(tmp_path / "big.model")
    cases = [
        ([f"--source={tmp_path / 'missing.jsonl'}"], "matches no file"),
        ([f"--source={tmp_path / 'nothing*.parquet'}"], "matches no file"),
        ([f"--source={tmp_path / 'notes.md'}"], "supported extension"),
        ([f"--source={tmp_path / 'one.jsonl'},{tmp_path / 'line.txt'}"], "mixes file types"),
        ([f"--source={tmp_path / 'content.jsonl'}"], "no such text field.*fields: content"),
        ([f"--source={tmp_path / 'empty.txt'}"], "empty.txt' is empty \\(0 bytes\\)"),
        ([f"--source={tmp_path / 'empty.jsonl'}"], "empty.jsonl' is empty \\(0 bytes\\)"),
        ([f"--source={tmp_path / 'blank.jsonl'}"], "no documents"),
        ([f"--source={tmp_path / 'one.jsonl'}"], "too few"),
        (["--tokenizer=nonsense"], "unknown tokenizer"),
        ([f"--tokenizer={big_vocab}", "--dtype=uint16"], "cannot hold token ids up to 66047"),
    ]
    for flags, message in cases:
        with pytest.raises(RunError, match=message):
            run(tmp_path, *flags)
        assert not (tmp_path / "out").exists(), flags
    # the text field goes missing only in a later file, after shards were written: they are removed
    # again
    docs = [{"text": d} for d in corpus()[:40]]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "b.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    monkeypatch.setattr(prep, "CHUNK_CHARS", 10_000)
    written, real_write_shard = [], prep.write_shard
    monkeypatch.setattr(prep, "write_shard", lambda *args: written.append(args[0])
                        or real_write_shard(*args))
    with pytest.raises(RunError, match="(?s)cannot read the input.*content"):
        run(tmp_path, f"--source={tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}",
            "--shard_tokens=1000")
    assert written and not (tmp_path / "out").exists()


def test_text_field_that_is_not_a_string(tmp_path):
    """A text field that holds something else than text: one line naming the file, the row, what it
    holds and the flag that picks another field; a missing field is still reported as such."""
    rows = [{"text": f"document {i}", "id": i} for i in range(10)]
    rows[6]["text"] = None
    (tmp_path / "null.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "x.jsonl").write_text("".join(json.dumps({"text": [f"part {i}", "b"],
                                                          "body": f"document {i}"}) + "\n"
                                              for i in range(10)))
    null, lists = str(tmp_path / "null.jsonl"), str(tmp_path / "x.jsonl")
    cases = [([f"--source={null}"], f"^row 7 of {re.escape(null)}: field 'text' is null, not a "
                                    "string; pass the field that holds the text as "
                                    "--text_field=NAME \\(fields: text, id\\)"),
             ([f"--source={lists}"], f"^row 1 of {re.escape(lists)}: field 'text' is a list, not a "
                                     "string; pass the field that holds the text as "
                                     "--text_field=NAME \\(fields: text, body\\)"),
             ([f"--source={lists}", "--text_field=title"],
              f"^row 1 of {re.escape(lists)}: no such text field 'title'; pass the field that "
              "holds the text as --text_field=NAME \\(fields: text, body\\)")]
    for flags, message in cases:
        with pytest.raises(RunError, match=message):
            run(tmp_path, *flags)
        assert not (tmp_path / "out").exists(), flags
    meta, out_dir = run(tmp_path, f"--source={lists}", "--text_field=body", "--val_every=5")
    assert split_docs(out_dir, "val") == ["document 0", "document 5"]


def test_unreadable_source_files_are_named_with_the_line(tmp_path):
    """Text that is not UTF-8, a line of a JSON Lines file that is not a JSON object, a JSON array
    with an error: one line naming the file and the line, counted from 1 (`datasets` names neither,
    and counts JSON rows from 0)."""
    rows = [json.dumps({"text": f"document {i}"}) for i in range(10)]
    files = {"latin1.jsonl": "\n".join(rows[:6] + ['{"text": "caf\xe9"}']
                                       + rows[6:]).encode("latin-1"),
             "latin1.txt": "line one\nline two\nna\xefve three\n".encode("latin-1"),
             "broken.jsonl": "\n".join(rows[:4] + ['{"text": "no end}'] + rows[4:]).encode(),
             "string.jsonl": "\n".join(rows[:2] + ['"just text"'] + rows[2:]).encode(),
             "array.json": ("[\n" + ",\n".join(rows[:5]) + ',\n{"text": oops}\n]\n').encode()}
    utf8 = "convert the file to UTF-8 \\(e.g. iconv -f latin1 -t utf-8\\)$"
    lines = "each line of a JSON Lines file must be one JSON object$"
    expected = {"latin1.jsonl": "line 7 of {}: not UTF-8 \\(byte 0xe9 at byte 14 of the line\\); "
                                f"{utf8}",
                "latin1.txt": "line 3 of {}: not UTF-8 \\(byte 0xef at byte 3 of the line\\); "
                              f"{utf8}",
                "broken.jsonl": "line 5 of {}: not valid JSON: Unterminated string starting at: "
                                f"column 10; {lines}",
                "string.jsonl": f"line 3 of {{}}: a string, not an object; {lines}",
                "array.json": "line 7 of {}: not valid JSON: Expecting value: column 10; fix the "
                              "file$"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(RunError, match="^"
                           + expected[name].format(re.escape(str(tmp_path / name)))):
            run(tmp_path, f"--source={tmp_path / name}", "--val_every=3")
        assert not (tmp_path / "out").exists(), name


def test_big_vocabulary_uses_uint32(tmp_path):
    path = write_two_byte_vocabulary(tmp_path / "tokenizer.model")
    meta, out_dir = run(tmp_path, f"--tokenizer={path}", "--val_every=10")
    assert meta["dtype"] == "uint32" and meta["tokenizer"]["bos_id"] == 65792
    ids = read_shard(out_dir / meta["splits"]["val"]["shards"][0])
    assert ids.dtype == np.uint32 and ids[0] == 65792 and ids.max() > 65535


def test_out_dir_with_other_shards_is_refused(tmp_path, checkpoints):
    _, out_dir = run(tmp_path, "--val_every=10")
    before = shard_bytes(out_dir)
    with pytest.raises(RunError, match="different tokenizer"):
        run(tmp_path, f"--tokenizer={checkpoints['qwen_json'][0]}", "--val_every=10")
    with pytest.raises(RunError, match="different settings.*val_every"):
        run(tmp_path, "--val_every=20")
    assert shard_bytes(out_dir) == before
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "train.bin").write_bytes(b"x")
    with pytest.raises(RunError, match="no meta.json"):
        run(tmp_path, out="foreign")


@pytest.mark.parametrize("flag, message", [("--nmu_proc=2", "unrecognized arguments: --nmu_proc=2"),
                                           ("--num_proc=two", "invalid int value"),
                                           ("--val_every=1",
                                            '--val_every=1 is out of range: must be >= 2'),
                                           ("--dtype=int8", "invalid choice")])
def test_cli_rejects_bad_flags(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit):
        prep.main([f"--out_dir={tmp_path / 'out'}", flag])
    err = capsys.readouterr().err
    # the usage lists the valid keys
    assert message in err and "--num_proc" in err and "--max_tokens" in err
    assert not (tmp_path / "out").exists()


def start_with_workers(tmp_path, checkpoints, workers):
    """prepare_data.py with 2 workers on the whole standard library, in a session of its own, once
    `workers` of them have started: (the process, the workers' pids). (The whole standard library:
    at 3M tokens, a quiet machine finished before a signal came, and Python then died of it on its
    way out.)"""
    qwen = checkpoints["qwen_json"][0]
    argv = [sys.executable, "prepare_data.py", "--source=stdlib", f"--tokenizer={qwen}",
            "--num_proc=2", f"--out_dir={tmp_path / 'out'}"]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.time() + 120
    while True:  # (the resource tracker is a child too; the workers run spawn_main)
        pids = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "spawn_main"],
                              capture_output=True, text=True).stdout.split()
        if len(pids) >= workers:
            return proc, [int(pid) for pid in pids]
        assert proc.poll() is None and time.time() < deadline, "the workers did not start"
        time.sleep(0.05)


def assert_ends_in_one_line_and_leaves_no_process(proc, last_line, status=1):
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status and err.strip().splitlines()[-1] == last_line, err
    assert "Traceback" not in err
    deadline = time.time() + 30
    while subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode == 0:
        assert time.time() < deadline, "a worker outlived the stop"
        time.sleep(0.2)


@pytest.mark.parametrize("signum, when", [(signal.SIGINT, "starting"), (signal.SIGINT, "working"),
                                          (signal.SIGTERM, "working")],
                         ids=["SIGINT-starting", "SIGINT-working", "SIGTERM-working"])
def test_a_stop_with_workers_is_one_line_and_leaves_no_process(tmp_path, checkpoints, signum,
                                                               when):
    """Issue 53: Ctrl-C on a BPE run with 2 workers gave a 25-line traceback (every worker's and the
    parent's). Now a Ctrl-C at the terminal (SIGINT to the whole process group) or SIGTERM to the
    parent ends it in one line that says the same command continues, and no worker is left; also
    when it comes while the workers start (multiprocessing.Pool once hung there, in its
    terminate)."""
    proc, _ = start_with_workers(tmp_path, checkpoints, 1 if when == "starting" else 2)
    if when == "working":
        time.sleep(1)
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    # (100M tokens a shard: none is whole yet, and the directory this run made is gone again)
    assert_ends_in_one_line_and_leaves_no_process(proc, (
        f"prepare_data.py: error: stopped by {signum.name}; no shard was written whole, so nothing "
        "was kept: the same command starts again"), 128 + signum)
    assert not (tmp_path / "out").exists()


def expected_shards(documents, val_every):
    """{file name: its bytes} of prepare_data.py --tokenizer=bytes --shard_tokens=1 on `documents`,
    worked out from docs/data.md's rules alone: chunks of whole documents that end once they hold
    CHUNK_CHARS characters, one train and one val shard per chunk; document i (counting from 0) held
    out when i % val_every == 0; each document its UTF-8 bytes and the end-of-text id 256; a shard
    the 24-byte header (b"ASASHARD", version 1, 2 bytes a token, the count), then uint16 ids."""
    chunks, chunk, chars = [], [], 0
    for i, text in enumerate(documents):
        chunk.append((i % val_every == 0, text))
        chars += len(text)
        if chars >= prep.CHUNK_CHARS:
            chunks.append(chunk)
            chunk, chars = [], 0
    chunks += [chunk] if chunk else []
    shards = {}
    for n, chunk in enumerate(chunks):
        for split, held_out in (("train", False), ("val", True)):
            ids = np.concatenate([np.append(np.frombuffer(text.encode(), np.uint8), 256)
                                  for is_val, text in chunk if is_val == held_out]).astype("<u2")
            shards[f"{split}_{n:06d}.bin"] = (b"ASASHARD" + (1).to_bytes(4, "little")
                                              + (2).to_bytes(4, "little")
                                              + len(ids).to_bytes(8, "little") + ids.tobytes())
    return shards


def listed_shards(out_dir):
    meta = json.loads((out_dir / "meta.json").read_text())
    return meta, [name for split in meta["splits"].values() for name in split["shards"]]


def test_a_stop_in_a_first_run_keeps_every_whole_shard_and_the_same_command_ends_it(tmp_path):
    """Issue 62: Ctrl-C during a first run (no shard from an earlier one) deleted the 23 shards it
    had written whole, and their directory. Now Ctrl-C (SIGINT to the process group, as a terminal
    sends it) at 20 shards or more keeps every shard meta.json lists, exits 130 (128 + SIGINT) with
    a line that says what it kept, and the same command then ends the run with every shard byte for
    byte what an uninterrupted run writes (worked out here from the corpus)."""
    documents = [f"{copy} {text}" for copy in range(68) for text in corpus()]  # ~31M characters
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps(dict(text=text)) + "\n" for text in documents))
    expected, out = expected_shards(documents, 10), tmp_path / "out"
    assert len(expected) >= 2 * 28
    argv = [sys.executable, "prepare_data.py", f"--source={source}", "--tokenizer=bytes",
            f"--out_dir={out}", "--shard_tokens=1", "--val_every=10", "--num_proc=2"]
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    while not ((out / "meta.json").is_file() and len(listed_shards(out)[1]) >= 2 * 20):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    meta, kept = listed_shards(out)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == (
        f"prepare_data.py: error: stopped by SIGINT; kept {len(kept) // 2} shard pair(s) written "
        f"whole in {out} ({meta['splits']['train']['tokens']:,} train tokens, "
        f"{meta['progress']['documents_read']:,} documents read): the same command continues from "
        "them"), err
    assert 20 <= len(kept) // 2 < len(expected) // 2 and not meta["complete"]
    assert sorted(os.listdir(out)) == sorted(["meta.json", *kept])
    assert all((out / name).read_bytes() == expected[name] for name in kept)
    again = subprocess.run(argv, cwd=Path(__file__).resolve().parents[1], capture_output=True,
                           text=True)
    assert again.returncode == 0, again.stderr
    meta, shards = listed_shards(out)
    assert meta["complete"] and sorted(shards) == sorted(expected)
    assert all((out / name).read_bytes() == expected[name] for name in expected)


def test_num_proc_above_the_cores_is_capped_with_a_note(tmp_path, monkeypatch, capsys):
    """Issue 62: --num_proc=1000 on 2 cores started 1000 tokenizer processes, which only took turns
    on the cores (103 s where 2 took 2.5 s). Now it is capped at the cores this process may use,
    with a note; the data is what any --num_proc gives."""
    monkeypatch.setattr(prep, "usable_cores", lambda: 1)  # (no worker process: one core)
    prep.main(["--source=builtin", f"--out_dir={tmp_path / 'out'}", "--num_proc=1000"])
    out, err = capsys.readouterr()
    assert ("note: --num_proc=1000 is more than the cores this process may use (1): tokenizing "
            "with --num_proc=1") in err.splitlines()
    assert out.rstrip().endswith("tokens/s with --num_proc=1")
    reference = run(tmp_path, "--source=builtin", out="reference")[1]
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(reference))
    assert all((tmp_path / "out" / name).read_bytes() == (reference / name).read_bytes()
               for name in os.listdir(reference) if name != "meta.json")


def test_a_worker_that_dies_is_one_line_and_leaves_no_process(tmp_path, checkpoints):
    """A worker killed (the OOM killer, a kill -9) ends the run with one line that names it, where
    multiprocessing.Pool waited forever for its result."""
    proc, pids = start_with_workers(tmp_path, checkpoints, 2)
    time.sleep(1)
    os.kill(pids[0], signal.SIGKILL)
    assert_ends_in_one_line_and_leaves_no_process(proc, (
        f"prepare_data.py: error: a tokenizer worker (pid {pids[0]}) died (killed by SIGKILL); if "
        "memory ran out, pass a smaller --num_proc"))
