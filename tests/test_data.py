"""Tests for data.py: the shard files (round trip, header validation) and read_split's checks of
each shard."""
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lmkit.data import read_meta, read_split  # noqa: E402
from prepare_data import read_shard, write_shard  # noqa: E402
from lmkit.errors import RunError  # noqa: E402
from helpers import flip_byte  # noqa: E402


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_shard_round_trip_and_header_validation(tmp_path, dtype):
    path = str(tmp_path / "x.bin")
    tokens = np.array([0, 1, 256, np.iinfo(dtype).max], dtype=dtype)
    write_shard(path, [tokens[:1], tokens[1:]], dtype)
    read = read_shard(path)
    assert read.dtype == np.dtype(dtype) and isinstance(read,
                                                        np.memmap) and not read.flags.writeable
    np.testing.assert_array_equal(read, tokens)
    assert os.listdir(tmp_path) == ["x.bin"]  # no temp file left behind
    data = Path(path).read_bytes()
    for wrong_size in (data[:-1], data + b"\0\0"):
        Path(path).write_bytes(wrong_size)
        with pytest.raises(RunError, match="truncated or corrupt"):
            read_shard(path)
    Path(path).write_bytes(b"NOTSHARD" + data[8:])
    with pytest.raises(RunError, match="bad magic"):
        read_shard(path)
    Path(path).write_bytes(data[:10])
    with pytest.raises(RunError, match="bad magic"):
        read_shard(path)


def test_read_split_checks_each_shard_once_per_process(tmp_path, monkeypatch):
    """write_shard returns the CRC-32 of the file it wrote; read_split refuses, naming the shard,
    one whose bytes differ from that checksum, and one that holds an id at or above the vocabulary
    size even when its checksum is the one recorded (the position counted from 1); an unchanged
    shard is checked once per process. A damaged meta.json is one line too."""
    names = ["train_000000.bin", "train_000001.bin"]
    ids = [np.arange(300, dtype=np.uint16) % 257, np.array([5, 6, 300, 7, 400], dtype=np.uint16)]
    checksums = {name: write_shard(str(tmp_path / name), [a], np.uint16) for name,
                 a in zip(names, ids)}
    for name in names:
        assert checksums[name] == f"crc32:{zlib.crc32((tmp_path / name).read_bytes()):08x}"
    meta = dict(vocab_size=257,
                splits=dict(train=dict(shards=names[:1]), val=dict(shards=names[1:])),
                checksums=checksums, command="python prepare_data.py --out_dir=x")
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    reads, crc32 = [], zlib.crc32
    monkeypatch.setattr(zlib, "crc32", lambda *args: reads.append(1) or crc32(*args))
    np.testing.assert_array_equal(read_split(str(tmp_path), "train")[0], ids[0])
    checked_once = len(reads)
    read_split(str(tmp_path), "train")
    assert len(reads) == checked_once > 0  # unchanged: not read again
    with pytest.raises(RunError, match=rf"^{re.escape(str(tmp_path / names[1]))}: token 3 "
                                       r"\(counting from 1\) is id "
                                       r"300, not below the vocabulary size 257 \(meta.json\): the "
                                       r"shard is damaged; "
                                       r"re-run the prepare_data.py command recorded in "
                                       r"meta.json"):
        read_split(str(tmp_path), "val")
    # an id that stays below the vocabulary size: only the CRC sees it
    damaged = flip_byte(tmp_path / names[0], 100)
    with pytest.raises(RunError, match=rf"^{re.escape(str(tmp_path / names[0]))}: damaged: its "
                                       r"CRC-32 is "
                                       rf"{zlib.crc32(damaged):08x}, but meta.json recorded "
                                       rf"{checksums[names[0]]}"):
        read_split(str(tmp_path), "train")
    (tmp_path / "meta.json").write_text(json.dumps(meta)[:-1])  # meta.json cut short
    with pytest.raises(RunError, match=rf"^{re.escape(str(tmp_path / 'meta.json'))}: damaged, not "
                                       r"a JSON file \("):
        read_split(str(tmp_path), "train")


def documented(path, out_dir):
    """The prepare_data.py command that a file of the repo (a config's header, the README) gives for
    out_dir, its continued lines joined."""
    text = re.sub(r"\s*\\\n[#\s]*", " ",
                  (Path(__file__).resolve().parents[1] / path).read_text(encoding="utf-8"))
    return re.search(rf"python prepare_data\.py [^\n)]*--out_dir={re.escape(out_dir)}[^\n)]*",
                     text).group(0).strip()


@pytest.mark.parametrize("out_dir,path", [("data/builtin_bytes", "config/tiny_cpu.py"),
                                          ("data/stdlib_bytes", "config/sink_study.py"),
                                          ("data/fineweb_edu_llama3", "README.md"),
                                          ("data/fineweb_edu_smollm2", "config/onegpu.py")])
def test_missing_data_names_the_command_that_prepares_it(tmp_path, monkeypatch, out_dir, path):
    """'run prepare_data.py first' said which command: now it gives the one the docs give for a
    directory they name, wherever the repo is."""
    command = documented(path, out_dir)
    monkeypatch.chdir(tmp_path)  # (where the directory is not: the repo may hold it)
    with pytest.raises(RunError) as e:
        read_meta(out_dir)
    assert (str(e.value) == f"data_dir={out_dir}: no such directory; run prepare_data.py first: "
                            f"{command}")
    # the same directory under another root: the same command, there
    moved = str(tmp_path / out_dir)
    with pytest.raises(RunError) as e:
        read_meta(moved)
    assert str(e.value).endswith(command.replace(f"--out_dir={out_dir}", f"--out_dir={moved}"))


def test_missing_data_of_another_name_gets_the_general_command(tmp_path):
    general = (f"python prepare_data.py --source=<builtin, stdlib, fineweb-edu or your own files> "
               f"--tokenizer=<bytes or the teacher's directory> --out_dir={tmp_path / 'mine'}")
    with pytest.raises(RunError) as e:
        read_meta(str(tmp_path / "mine"))
    assert str(e.value) == (f"data_dir={tmp_path / 'mine'}: no such directory; "
                            f"run prepare_data.py first: {general}")
    (tmp_path / "mine").mkdir()
    with pytest.raises(RunError) as e:
        read_meta(str(tmp_path / "mine"))
    assert str(e.value) == (f"{tmp_path / 'mine' / 'meta.json'}: no such file; data_dir must be an "
                            f"output directory of prepare_data.py, which prepares one: {general}")


def train_refusal(data_dir, tmp_path):
    """train.py on data_dir, run as a user runs it: its exit status and stderr's lines."""
    done = subprocess.run([sys.executable, "train.py", "--device=cpu", f"--data_dir={data_dir}",
                           f"--out_dir={tmp_path / 'run'}", "--vocab_size=320", "--block_size=32"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    return done.returncode, done.stderr.splitlines()


def test_a_meta_json_field_of_another_type_is_named(data_dir, tmp_path):
    """Issue 62: a vocab_size that is a string in meta.json stopped train.py with a traceback
    (TypeError: '>' not supported between instances of 'str' and 'int'). Now every field is
    checked for the type prepare_data.py writes it with, and the first that is not is named, in one
    line, before any work; nothing is written."""
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps(dict(meta, vocab_size="257")))
    assert train_refusal(data, tmp_path) == (1, [
        f"train.py: error: {data / 'meta.json'}: vocab_size is '257' (a string), where "
        "prepare_data.py writes an integer: the file was edited or damaged; prepare the data "
        "again into a new --out_dir"])
    assert not (tmp_path / "run").exists()
    edits = [(lambda m: m["splits"]["val"].update(tokens=None), "splits.val.tokens is None (null), "
              "where prepare_data.py writes an integer"),
             (lambda m: m["splits"]["train"]["shards"].append(7), "an element of "
              "splits.train.shards is 7 (an integer), where prepare_data.py writes a string"),
             (lambda m: m["tokenizer"].update(special_tokens=["<|endoftext|>"]), "tokenizer."
              "special_tokens is ['<|endoftext|>'] (a list), where prepare_data.py writes an "
              "object"),
             (lambda m: m["tokenizer"].update(bos_id=False), "tokenizer.bos_id is False (true or "
              "false), where prepare_data.py writes an integer or null"),
             (lambda m: m["checksums"].update({"train_000000.bin": 1}), "an element of checksums "
              "is 1 (an integer), where prepare_data.py writes a string"),
             (lambda m: m.pop("splits"), "has no splits"),
             (lambda m: m.update(dtype="int8"), "dtype is 'int8', where prepare_data.py writes "
              "uint16 or uint32")]
    for edit, problem in edits:
        edited = json.loads(json.dumps(meta))
        edit(edited)
        (data / "meta.json").write_text(json.dumps(edited))
        with pytest.raises(RunError) as e:
            read_meta(str(data))
        assert str(e.value) == (f"{data / 'meta.json'}: {problem}: the file was edited or damaged; "
                                "prepare the data again into a new --out_dir")


def test_a_file_given_as_data_dir_is_not_a_directory(tmp_path):
    """Issue 62: a file passed as data_dir was "no such directory"."""
    (tmp_path / "data").write_text("not a directory")
    code, err = train_refusal(tmp_path / "data", tmp_path)
    assert code == 1 and err == [
        f"train.py: error: data_dir={tmp_path / 'data'}: is a file, not a directory; run "
        "prepare_data.py first: python prepare_data.py --source=<builtin, stdlib, fineweb-edu or "
        "your own files> --tokenizer=<bytes or the teacher's directory> "
        f"--out_dir={tmp_path / 'data'}"]
