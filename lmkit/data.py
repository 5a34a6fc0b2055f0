"""Reading data: the token shards (each checked against its recorded CRC-32 once per process),
meta.json, the first token of every window, and Windows, what training and the evaluations read.
NumPy, not torch, so that importing it stays cheap. docs/data.md has the shard layout, what each
check catches, and why a CRC-32 is enough."""
import json
import os
import struct
import sys
import zlib

import numpy as np

from lmkit.data_meta import check_meta
from lmkit.errors import RunError

MAGIC, VERSION = b"ASASHARD", 1
HEADER = struct.Struct("<8sIIQ")  # magic, version, bytes per token, token count; then the token ids
REBUILD = ("re-run the prepare_data.py command recorded in meta.json: it rebuilds missing and "
           "damaged shards")


def map_shard(path):
    """Map a shard's ids read-only (np.memmap). Returns (ids, None), or (None, what is wrong)."""
    with open(path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size or header[:8] != MAGIC:
        return None, f"{path}: not a token shard written by prepare_data.py (bad magic)"
    _, version, itemsize, count = HEADER.unpack(header)
    if version != VERSION or itemsize not in (2, 4):
        return None, f"{path}: unsupported shard version {version} / {itemsize} bytes per token"
    expected, actual = HEADER.size + count * itemsize, os.path.getsize(path)
    if actual != expected:
        return None, (f"{path}: truncated or corrupt: the header promises {count} tokens "
                      f"({expected} bytes), the file has {actual} bytes")
    return np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=HEADER.size, shape=count), None


checked = set()  # (path, inode, size, mtime, checksum, vocab size) of each shard checked


def check_shard(path, checksum, vocab_size):
    """Check a shard in one pass, once per process: that it exists, its header and size, its CRC-32
    (unless checksum is None) and its ids (< vocab_size). Returns (ids, None) or (None, why not)."""
    if not os.path.isfile(path):
        return None, f"{path}: missing (meta.json lists it)"
    ids, fault = map_shard(path)
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, checksum, vocab_size)
    if fault or key in checked:
        return ids, fault
    crc = zlib.crc32(HEADER.pack(MAGIC, VERSION, ids.itemsize, len(ids)))  # as map_shard read it
    bad = None  # the position of the first id out of range
    step = (1 << 24) // ids.itemsize  # 16 MiB at a time
    for start in range(0, len(ids), step):
        chunk = ids[start:start + step]
        crc = zlib.crc32(chunk, crc)
        if bad is None and chunk.max() >= vocab_size:
            bad = start + int(np.argmax(chunk >= vocab_size))
    if checksum is not None and f"crc32:{crc:08x}" != checksum:
        return None, (f"{path}: damaged: its CRC-32 is {crc:08x}, but meta.json recorded "
                      f"{checksum} when it was written")
    if bad is not None:
        return None, (f"{path}: token {bad + 1:,} (counting from 1) is id {int(ids[bad]):,}, not "
                      f"below the vocabulary size {vocab_size:,} (meta.json): the shard is damaged")
    checked.add(key)
    return ids, None


FINEWEB = ("--source=fineweb-edu --fineweb_config=sample-100BT --tokenizer=checkpoints/{teacher} "
           "--out_dir={out} --max_tokens=20_000_000_000 --num_proc=32")
KNOWN_DATA = {  # the prepare_data.py flags of the directories the configs and docs name
    "data/builtin_bytes": "--source=builtin --tokenizer=bytes --out_dir={out} --val_every=10",
    "data/stdlib_bytes": "--source=stdlib --tokenizer=bytes --out_dir={out} --val_every=50",
    "data/fineweb_edu_llama3": FINEWEB.replace("{teacher}", "Llama-3.2-3B"),
    "data/fineweb_edu_qwen": FINEWEB.replace("{teacher}", "Qwen1.5-1.8B"),
    "data/fineweb_edu_smollm2": "--source=fineweb-edu --tokenizer=checkpoints/SmolLM2-360M "
                                "--out_dir={out} --max_tokens=1_100_000_000",
}
GENERAL_DATA = ("--source=<builtin, stdlib, fineweb-edu or your own files> "
                "--tokenizer=<bytes or the teacher's directory> --out_dir={out}")


def prepare_command(data_dir):
    """The command that prepares data_dir: exact for a directory the configs name, else general."""
    known = KNOWN_DATA.get("/".join(os.path.normpath(data_dir).split(os.sep)[-2:]), GENERAL_DATA)
    return "python prepare_data.py " + known.replace("{out}", data_dir)


def read_meta(data_dir):
    """meta.json of a prepare_data.py output directory (what train.py and distill.py read first)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isdir(data_dir):
        what = "is a file, not a directory" if os.path.exists(data_dir) else "no such directory"
        raise RunError(f"data_dir={data_dir}: {what}; run prepare_data.py first: "
                       f"{prepare_command(data_dir)}")
    if not os.path.isfile(path):
        raise RunError(f"{path}: no such file; data_dir must be an output directory of "
                       f"prepare_data.py, which prepares one: {prepare_command(data_dir)}")
    try:
        with open(path, encoding="utf-8") as f:
            return check_meta(json.load(f), path)
    except ValueError as e:  # (also not UTF-8)
        raise RunError(f"{path}: damaged, not a JSON file ({e}); prepare the data again into a new "
                       "--out_dir") from None


noted = set()  # the directories whose missing checksums this process has noted


def read_split(data_dir, split, meta=None):
    """The shards of one split of a prepared directory as read-only np.memmaps, each checked first
    (check_shard): every reader of shards comes here. meta: its meta.json, read if not given."""
    meta = read_meta(data_dir) if meta is None else meta
    checksums = meta.get("checksums", {})  # none in a meta.json from before they were recorded
    unchecked = [name for info in meta["splits"].values() for name in info["shards"]
                 if name not in checksums]
    if unchecked and data_dir not in noted:
        noted.add(data_dir)
        print(f"note: {os.path.join(data_dir, 'meta.json')} records no checksum for "
              f"{len(unchecked)} shard(s) (data prepared before checksums were recorded): they are "
              "checked for ids below the vocabulary size only; prepare the data again into a new "
              "--out_dir to have them checked in full", file=sys.stderr)
    shards = []
    for name in meta["splits"][split]["shards"]:
        path = os.path.join(data_dir, name)
        ids, fault = check_shard(path, checksums.get(name), meta["vocab_size"])
        if fault:
            raise RunError(f"{fault}; {REBUILD}")
        shards.append(ids)
    return shards


def prefix_id(tokenizer):
    """The tokenizer's BOS, else its end-of-text token (lm-eval's prefix token); from meta.json."""
    token = tokenizer['bos_id'] if tokenizer.get('bos_id') is not None else tokenizer.get('eos_id')
    if token is None:
        raise RunError(f"first_token='prefix': the tokenizer {tokenizer['spec']} has neither a BOS "
                       "nor an end-of-text token to put first; use first_token='stream'")
    return token


def first_token_id(first_token, tokenizer):
    """The id at position 0 of every window: None (first_token='stream'), or prefix_id's."""
    return prefix_id(tokenizer) if first_token == 'prefix' else None


class Windows:
    """A split's windows of block_size inputs and next-token targets: block_size + 1 stream tokens
    each (neighbours share one), or the id first_token, then block_size - 1 (each a target once)."""

    def __init__(self, data_dir, split, block_size, first_token=None):
        self.shards = read_split(data_dir, split)
        self.block_size, self.first_token = block_size, first_token
        self.row = block_size + (first_token is None)  # stream tokens per window
        per_shard = [max(0, (len(s) - self.row) // block_size + 1) for s in self.shards]
        self.starts = np.cumsum([0] + per_shard)  # the first window of each shard
        if self.starts[-1] == 0:
            raise RunError(f"{data_dir}: the {split} split has fewer than block_size"
                           f"{' + 1' * (first_token is None)} = {self.row} tokens")
        self.perm_key, self.perm = None, None  # the permutation of the current (seed, epoch)

    def __len__(self):
        return int(self.starts[-1])

    def get(self, indices):
        """(x, y): int64 arrays (len(indices), block_size), the windows and their targets."""
        shards = np.searchsorted(self.starts, indices, side="right") - 1
        offsets = (np.asarray(indices) - self.starts[shards]) * self.block_size
        rows = [self.shards[s][o:o + self.row] for s, o in zip(shards, offsets)]
        batch = np.stack(rows).astype(np.int64)
        if self.first_token is not None:
            batch = np.insert(batch, 0, self.first_token, axis=1)
        return batch[:, :-1], batch[:, 1:]

    def step_indices(self, seed, step, global_batch_size):
        """The window indices of optimizer step `step`: positions step*G ... (step+1)*G - 1 of the
        stream of epochs, each epoch a permutation of all windows seeded by (seed, epoch)."""
        out = []
        for position in range(step * global_batch_size, (step + 1) * global_batch_size):
            epoch, k = divmod(position, len(self))
            if (seed, epoch) != self.perm_key:
                self.perm = np.random.default_rng([seed, epoch]).permutation(len(self))
                self.perm_key = (seed, epoch)
            out.append(int(self.perm[k]))
        return out
