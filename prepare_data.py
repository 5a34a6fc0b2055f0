"""
Prepare training data once, before `torchrun train.py`: stream documents, tokenize them with the
teacher's tokenizer (through tiktoken) and write train/val shards of token ids.

    # offline CPU quick start: Python's own documentation, byte-level tokens
    python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes --val_every=10
    # the paper: 20B tokens of FineWeb-Edu with the teacher's (here Llama-3.2-3B's) tokenizer
    python prepare_data.py --source=fineweb-edu --fineweb_config=sample-100BT \
        --tokenizer=checkpoints/Llama-3.2-3B --out_dir=data/fineweb_edu_llama3 --max_tokens=20_000_000_000

Other scripts import the pieces they need (this module imports `datasets` only when it streams):
    from prepare_data import load_tokenizer, encode_document, read_shard
"""
import argparse
import base64
import glob
import hashlib
import json
import multiprocessing
import os
import shlex
import struct
import sys
import time
import unicodedata
from collections import deque

import numpy as np
import tiktoken

# -----------------------------------------------------------------------------
# Tokenizers, all as tiktoken Encodings

# Pre-tokenisation regexes: text is first split into pieces with these, then BPE runs inside each piece.
# Llama 3: the cl100k-style pattern of Meta's tokenizer.py (also the Split regex in its tokenizer.json).
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen1.5 / Qwen2: the same, except that digits are split one at a time (\p{N} instead of \p{N}{1,3}).
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# The byte tokenizer has no merges, so every split gives the same ids; fixed-size pieces are the fastest.
BYTES_PATTERN = r"[\s\S]{1,256}"

# Per tokenizer family (the Encoding's name): its pattern, whether text is NFC-normalised first, and
# the document boundaries of the teacher's convention, which every document written here gets:
#   llama3: <|begin_of_text|> before each document (the HF Llama-3 tokenizer prepends it to every text)
#   qwen2:  <|endoftext|> after each document (Qwen has no BOS token; <|endoftext|> ends a document)
#   bytes:  <|endoftext|> after each document (the GPT-2 / nanoGPT convention)
FAMILIES = {
    "bytes": dict(pattern=BYTES_PATTERN, nfc=False, bos=None, eos="<|endoftext|>"),
    "llama3": dict(pattern=LLAMA3_PATTERN, nfc=False, bos="<|begin_of_text|>", eos=None),
    "qwen2": dict(pattern=QWEN2_PATTERN, nfc=True, bos=None, eos="<|endoftext|>"),
}
MODEL_TYPES = {"llama": "llama3", "qwen2": "qwen2"}  # config.json "model_type" -> family (Qwen1.5 is "qwen2")


class NFCEncoding(tiktoken.Encoding):
    """Qwen's tokenizer NFC-normalises its input (tokenizer.json "normalizer": NFC) and tiktoken has no
    normaliser, so this Encoding normalises before encoding; decode is unchanged."""

    def encode_ordinary(self, text):
        return super().encode_ordinary(unicodedata.normalize("NFC", text))

    def encode(self, text, **kwargs):
        return super().encode(unicodedata.normalize("NFC", text), **kwargs)

    def encode_to_numpy(self, text, **kwargs):
        return super().encode_to_numpy(unicodedata.normalize("NFC", text), **kwargs)


def gpt2_unicode_to_byte():
    """Byte-level BPE vocabularies (GPT-2, Llama-3's tokenizer.json, Qwen) spell each byte as one printable
    character: bytes that are printable in Latin-1 stand for themselves, the other 68 are mapped in order
    to chr(256), chr(257), ... (GPT-2's bytes_to_unicode). This returns the inverse map, char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def read_tiktoken_file(path):
    """A tiktoken BPE file (Llama-3's original/tokenizer.model): one 'base64(token bytes) rank' per line.
    Parsed here rather than with tiktoken.load.load_tiktoken_bpe, which caches files by path in /tmp and
    would silently return stale ranks after a file at the same path changes."""
    ranks = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:  # also binascii.Error
                raise SystemExit(f"{path}:{line_no}: not a tiktoken BPE file (expected 'base64-token rank' lines; "
                                 f"SentencePiece models such as Llama-2's are not supported)")
    if not ranks:
        raise SystemExit(f"{path}: empty tokenizer file")
    return ranks


def llama3_special_tokens(n_ranks):
    """The 256 special tokens that Meta's Llama-3 tokenizer.py appends after the BPE ranks (128000-128255
    for the real vocabulary); used when a checkpoint has no tokenizer.json naming them."""
    names = (["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
             + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
             + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
    return {name: n_ranks + i for i, name in enumerate(names)}


def byte_level_bpe_ranks(vocab, merges, special_tokens, where):
    """tiktoken ranks from a Hugging Face byte-level BPE (vocab: token string -> id, merges: 'a b' lines).
    The rank of a token is its id. tiktoken merges the adjacent pair whose merged token has the lowest rank,
    HF merges the pair listed first in merges; the two agree when ids grow with merge order, as in vocabularies
    built by BPE training (GPT-2, Llama-3, Qwen), so that is checked instead of silently tokenizing differently."""
    to_byte = gpt2_unicode_to_byte()
    special_ids = set(special_tokens.values())

    def to_bytes(token):
        try:
            return bytes(to_byte[c] for c in token)
        except KeyError:
            raise SystemExit(f"{where}: token {token!r} is not byte-level BPE; only byte-level BPE tokenizers "
                             f"(Llama-3, Qwen) can be converted to tiktoken")

    ranks = {to_bytes(token): i for token, i in vocab.items() if i not in special_ids}
    last = -1
    for merge in merges:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        rank = ranks.get(to_bytes(left) + to_bytes(right), -1)
        if rank < last:
            raise SystemExit(f"{where}: merge {left!r} + {right!r} is out of id order; tiktoken cannot reproduce "
                             f"this tokenizer exactly")
        last = rank
    return ranks


def load_tokenizer(spec):
    """A tiktoken.Encoding for --tokenizer=spec:
    'bytes'          256 byte tokens + <|endoftext|> = 256; needs no file.
    a file           a tiktoken BPE file (Llama-3's original/tokenizer.model), with Llama-3 conventions.
    a directory      a Llama-3 or Qwen1.5/Qwen2 checkpoint (config.json's model_type picks the family) with
                     original/tokenizer.model, tokenizer.json, or vocab.json + merges.txt (in that order).
    The Encoding's name is its family (a key of FAMILIES), which encode_document uses."""
    if spec == "bytes":
        ranks, special_tokens, family = {bytes([b]): b for b in range(256)}, {"<|endoftext|>": 256}, "bytes"
    elif os.path.isfile(spec):
        ranks = read_tiktoken_file(spec)
        special_tokens, family = llama3_special_tokens(len(ranks)), "llama3"
    elif os.path.isdir(spec):
        ranks, special_tokens, family = load_checkpoint_tokenizer(spec)
    else:
        raise SystemExit(f"--tokenizer={spec!r}: unknown tokenizer; expected 'bytes', a tiktoken BPE file, or a "
                         f"Llama-3 / Qwen checkpoint directory")
    conv = FAMILIES[family]
    for name in (conv["bos"], conv["eos"]):
        if name and name not in special_tokens:
            raise SystemExit(f"--tokenizer={spec!r}: has no {name} token, which marks document boundaries")
    cls = NFCEncoding if conv["nfc"] else tiktoken.Encoding
    return cls(family, pat_str=conv["pattern"], mergeable_ranks=ranks, special_tokens=special_tokens)


def load_checkpoint_tokenizer(model_dir):
    """(ranks, special tokens, family) from a Hugging Face checkpoint (or tokenizer) directory."""
    def path(*names):
        return os.path.join(model_dir, *names)

    def read_json(name):
        with open(path(name), encoding="utf-8") as f:
            return json.load(f)

    model_type = read_json("config.json").get("model_type") if os.path.isfile(path("config.json")) else None
    if model_type not in MODEL_TYPES:
        raise SystemExit(f"--tokenizer={model_dir}: config.json has model_type {model_type!r}; supported: "
                         f"{sorted(MODEL_TYPES)} (Llama-3 and Qwen1.5/Qwen2 checkpoints)")
    family = MODEL_TYPES[model_type]
    tokenizer_json = read_json("tokenizer.json") if os.path.isfile(path("tokenizer.json")) else None
    # Special tokens are named in tokenizer.json ("added_tokens") or tokenizer_config.json ("added_tokens_decoder").
    if tokenizer_json:
        special_tokens = {t["content"]: t["id"] for t in tokenizer_json.get("added_tokens", [])}
    elif os.path.isfile(path("tokenizer_config.json")):
        decoder = read_json("tokenizer_config.json").get("added_tokens_decoder", {})
        special_tokens = {t["content"]: int(i) for i, t in decoder.items()}
    else:
        special_tokens = {}

    if os.path.isfile(path("original", "tokenizer.model")):
        ranks = read_tiktoken_file(path("original", "tokenizer.model"))
        return ranks, special_tokens or llama3_special_tokens(len(ranks)), family
    if tokenizer_json:
        model = tokenizer_json["model"]
        if model.get("type") != "BPE":
            raise SystemExit(f"{path('tokenizer.json')}: a {model.get('type')} model; only byte-level BPE is supported")
        ranks = byte_level_bpe_ranks(model["vocab"], model["merges"], special_tokens, path("tokenizer.json"))
        return ranks, special_tokens, family
    if os.path.isfile(path("vocab.json")) and os.path.isfile(path("merges.txt")):
        with open(path("merges.txt"), encoding="utf-8") as f:
            merges = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#version")]
        ranks = byte_level_bpe_ranks(read_json("vocab.json"), merges, special_tokens, path("vocab.json"))
        return ranks, special_tokens, family
    raise SystemExit(f"--tokenizer={model_dir}: has no original/tokenizer.model, tokenizer.json, or "
                     f"vocab.json + merges.txt")


def encode_document(enc, text):
    """Token ids of one document with the boundary tokens of its tokenizer family (see FAMILIES).
    Special-token strings inside the text are encoded as ordinary text, so data cannot forge a boundary."""
    conv = FAMILIES[enc.name]
    ids = enc.encode_ordinary(text)
    if conv["bos"]:
        ids = [enc.encode_single_token(conv["bos"])] + ids
    if conv["eos"]:
        ids.append(enc.encode_single_token(conv["eos"]))
    return ids


def tokenizer_info(enc, spec):
    """What meta.json records about the tokenizer: enough to rebuild it (spec) and to check that a rebuilt
    or a different one is the same (sha256 over pattern, specials and all ranks)."""
    conv = FAMILIES[enc.name]
    h = hashlib.sha256(json.dumps([enc.name, enc._pat_str, conv["nfc"], enc._special_tokens], sort_keys=True).encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    bos = enc.encode_single_token(conv["bos"]) if conv["bos"] else None
    eos = enc.encode_single_token(conv["eos"]) if conv["eos"] else None
    return dict(spec=spec if spec == "bytes" else os.path.abspath(spec), family=enc.name, pattern=enc._pat_str,
                nfc=conv["nfc"], n_vocab=enc.n_vocab, special_tokens=enc._special_tokens, bos_id=bos, eos_id=eos,
                sha256=h.hexdigest())

# -----------------------------------------------------------------------------
# Shards: a 24-byte little-endian header, then the token ids (uint16 or uint32, little-endian).
#   magic 8 bytes b"ASASHARD" | version uint32 | bytes per token uint32 (2 or 4) | token count uint64
# The count and the file size together reveal a truncated file; the magic a file of some other kind.

MAGIC, VERSION = b"ASASHARD", 1
HEADER = struct.Struct("<8sIIQ")


def write_shard(path, arrays, dtype):
    """Write the concatenation of `arrays` as one shard, atomically: a crash leaves at most a *.tmp file."""
    dtype = np.dtype(dtype).newbyteorder("<")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, dtype.itemsize, sum(len(a) for a in arrays)))
        for a in arrays:
            f.write(np.asarray(a, dtype=dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_shard(path):
    """The token ids of a shard as a read-only memory-mapped numpy array (the header is validated first)."""
    with open(path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size or header[:8] != MAGIC:
        raise SystemExit(f"{path}: not a token shard written by prepare_data.py (bad magic)")
    _, version, itemsize, count = HEADER.unpack(header)
    if version != VERSION or itemsize not in (2, 4):
        raise SystemExit(f"{path}: unsupported shard version {version} / {itemsize} bytes per token")
    expected, actual = HEADER.size + count * itemsize, os.path.getsize(path)
    if actual != expected:
        raise SystemExit(f"{path}: truncated or corrupt: the header promises {count} tokens ({expected} bytes), "
                         f"the file has {actual} bytes; re-run prepare_data.py")
    return np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=HEADER.size, shape=(count,))

def read_meta(data_dir):
    """meta.json of a prepare_data.py output directory (what train.py and distill.py read first)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isdir(data_dir):
        raise SystemExit(f"data_dir={data_dir}: no such directory; run prepare_data.py first")
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no such file; data_dir must be an output directory of prepare_data.py")
    with open(path) as f:
        return json.load(f)


class Windows:
    """A split cut into windows of block_size + 1 tokens (inputs and their next-token targets; consecutive
    windows share one token), for training (train.py) and evaluation (distill.py). NumPy only, so that
    importing this module stays cheap for the tokenizer workers."""

    def __init__(self, data_dir, split, block_size):
        names = read_meta(data_dir)["splits"][split]["shards"]
        self.shards = [read_shard(os.path.join(data_dir, name)) for name in names]
        self.block_size = block_size
        self.starts = np.cumsum([0] + [(len(s) - 1) // block_size for s in self.shards])  # first window of each shard
        if self.starts[-1] == 0:
            raise SystemExit(f"{data_dir}: the {split} split has fewer than block_size + 1 = {block_size + 1} tokens")
        self.perm_key, self.perm = None, None  # the permutation of the current (seed, epoch)

    def __len__(self):
        return int(self.starts[-1])

    def get(self, indices):
        """(x, y): int64 arrays (len(indices), block_size), the windows at these indices and their targets."""
        rows = []
        for i in indices:
            shard = int(np.searchsorted(self.starts, i, side="right")) - 1
            offset = (int(i) - int(self.starts[shard])) * self.block_size
            rows.append(self.shards[shard][offset:offset + self.block_size + 1])
        batch = np.stack(rows).astype(np.int64)
        return batch[:, :-1], batch[:, 1:]

    def step_indices(self, seed, step, global_batch_size):
        """The window indices of optimizer step `step`: positions step*G ... (step+1)*G - 1 of the stream of
        epochs, each epoch a permutation of all windows seeded by (seed, epoch)."""
        out = []
        for position in range(step * global_batch_size, (step + 1) * global_batch_size):
            epoch, k = divmod(position, len(self))
            if (seed, epoch) != self.perm_key:
                self.perm = np.random.default_rng([seed, epoch]).permutation(len(self))
                self.perm_key = (seed, epoch)
            out.append(int(self.perm[k]))
        return out


# -----------------------------------------------------------------------------
# Sources: every source is a `datasets` IterableDataset, so reading is streamed (memory does not grow with
# the dataset) and its state_dict() lets an interrupted run resume without re-reading finished data.

BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def builtin_corpus():
    """The offline corpus: the Python Language Reference help topics that ship with every Python
    (pydoc_data.topics, what help('assert') shows; ~0.5 MB of English prose and code), one document per topic."""
    from pydoc_data.topics import topics
    return [topics[name] for name in sorted(topics)]


def resolve_files(source):
    """The files named by a comma-separated list of paths and globs, in the order given (globs sorted)."""
    files = []
    for pattern in source.split(","):
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise SystemExit(f"--source: {pattern!r} matches no file")
        for f in matches:
            if not os.path.isfile(f) or os.path.splitext(f)[1] not in BUILDERS:
                raise SystemExit(f"--source: {f!r} is not a file with a supported extension ({', '.join(BUILDERS)})")
            files.append(os.path.abspath(f))
    if len({BUILDERS[os.path.splitext(f)[1]] for f in files}) > 1:
        raise SystemExit("--source: mixes file types; run prepare_data.py once per type")
    return files


def open_source(source_info):
    """The document stream as (IterableDataset, name of its text column)."""
    import datasets  # slow to import, so only here
    source = source_info["source"]
    if source == "fineweb-edu":
        try:
            ds = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name=source_info["fineweb_config"],
                                       split="train", streaming=True)
        except (OSError, ValueError) as e:  # offline, or no such config
            raise SystemExit(f"--source=fineweb-edu: cannot open HuggingFaceFW/fineweb-edu "
                             f"({source_info['fineweb_config']}): {e}")
        return ds, source_info["text_field"]
    if source == "builtin":
        return datasets.Dataset.from_dict({"text": builtin_corpus()}).to_iterable_dataset(), "text"
    files = source_info["files"]
    builder = BUILDERS[os.path.splitext(files[0])[1]]
    if builder == "text":  # the text builder always names its column "text"
        ds = datasets.load_dataset("text", data_files=files, split="train", streaming=True,
                                   sample_by=source_info["txt_sample_by"])
        return ds, "text"
    return datasets.load_dataset(builder, data_files=files, split="train", streaming=True), source_info["text_field"]


CHUNK_CHARS = 1 << 20  # documents are tokenized in chunks of about 1M characters (one task for a worker)


def document_chunks(ds, text_field, first_index, val_every):
    """Group the stream into chunks of whole documents, in stream order. Chunk boundaries depend only on the
    data, so the output does not depend on --num_proc. Document i (counting non-empty documents from 0) is
    held out for validation when i % val_every == 0. Yields (docs, (documents read so far, stream state))."""
    docs, n_chars, index = [], 0, first_index
    try:
        for row in ds:
            text = row.get(text_field)
            if not isinstance(text, str):
                raise SystemExit(f"--text_field={text_field!r}: document {index} has no such text field "
                                 f"(fields: {', '.join(row)})")
            if text:
                docs.append((index % val_every == 0, text))
                index += 1
                n_chars += len(text)
            if n_chars >= CHUNK_CHARS:
                yield docs, (index, ds.state_dict())
                docs, n_chars = [], 0
    except ValueError as e:  # unreadable input: bad JSON, not UTF-8, columns that differ between files, ...
        raise SystemExit(f"--source: cannot read the input: {e}") from e
    if docs:
        yield docs, (index, ds.state_dict())

# -----------------------------------------------------------------------------
# Parallel tokenization

worker_enc, worker_dtype = None, None  # set by init_worker in each worker (in this process for --num_proc=1)


def init_worker(enc, dtype):
    global worker_enc, worker_dtype
    worker_enc, worker_dtype = enc, dtype


def tokenize_chunk(docs):
    """-> (train token ids, train document lengths, val token ids, number of val documents)"""
    train, val = [], []
    for is_val, text in docs:
        (val if is_val else train).append(np.array(encode_document(worker_enc, text), dtype=worker_dtype))
    join = lambda arrays: np.concatenate(arrays) if arrays else np.empty(0, worker_dtype)
    return join(train), np.array([len(a) for a in train], dtype=np.int64), join(val), len(val)


def tokenize_in_order(chunks, enc, dtype, num_proc):
    """Yields (tokenize_chunk(docs), tag) for each (docs, tag), in order. Unlike Pool.imap, which reads its
    whole input ahead into a queue, at most 2 * num_proc chunks are in flight, so memory stays bounded."""
    if num_proc == 1:
        init_worker(enc, dtype)
        for docs, tag in chunks:
            yield tokenize_chunk(docs), tag
        return
    # spawn: workers start clean instead of inheriting the parent's threads (pyarrow) through fork
    with multiprocessing.get_context("spawn").Pool(num_proc, init_worker, (enc, dtype)) as pool:
        pending = deque()
        for docs, tag in chunks:
            pending.append((pool.apply_async(tokenize_chunk, (docs,)), tag))
            if len(pending) >= 2 * num_proc:
                result, tag = pending.popleft()
                yield result.get(), tag
        while pending:
            result, tag = pending.popleft()
            yield result.get(), tag

# -----------------------------------------------------------------------------
# The output directory: shards train_000000.bin, val_000000.bin, ... and meta.json, which is rewritten
# (atomically) after every pair of shards and records the progress an interrupted run resumes from.


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def remove_outputs(out_dir, keep=()):
    """Delete this script's files in out_dir except `keep`: the unconfirmed shards of an interrupted run,
    or everything when a fresh run fails on bad input."""
    for name in os.listdir(out_dir):
        if name not in keep and (name == "meta.json" or name.endswith((".bin", ".tmp"))):
            os.remove(os.path.join(out_dir, name))


def start_or_resume(out_dir, meta):
    """The meta to continue from: `meta` for a fresh run, or out_dir's meta.json if it was made with the same
    tokenizer and settings. Anything else in out_dir is an error, so shards are never mixed up."""
    meta_path = os.path.join(out_dir, "meta.json")
    if not os.path.exists(meta_path):
        if os.path.isdir(out_dir) and any(not name.endswith(".tmp") for name in os.listdir(out_dir)):
            raise SystemExit(f"--out_dir={out_dir} is not empty and has no meta.json; use an empty or new directory")
        return meta
    with open(meta_path) as f:
        old = json.load(f)
    if old["tokenizer"]["sha256"] != meta["tokenizer"]["sha256"]:
        old_tok = old["tokenizer"]
        raise SystemExit(f"--out_dir={out_dir} holds shards of a different tokenizer ({old_tok['family']} from "
                         f"{old_tok['spec']}, n_vocab {old_tok['n_vocab']}); use another --out_dir")
    changed = [key for key in meta["settings"] if old["settings"].get(key) != meta["settings"][key]]
    if changed:
        raise SystemExit(f"--out_dir={out_dir} was prepared with different settings ({', '.join(changed)}); "
                         f"use another --out_dir")
    return old


def describe_source(args):
    """Everything that determines the document stream; recorded in meta.json and checked on resume."""
    if args.source == "fineweb-edu":
        return dict(source=args.source, fineweb_config=args.fineweb_config, text_field=args.text_field)
    if args.source == "builtin":  # the help topics differ between Python versions
        return dict(source=args.source, python=sys.version.split()[0])
    files = resolve_files(args.source)
    if BUILDERS[os.path.splitext(files[0])[1]] == "text":
        return dict(source=args.source, files=files, txt_sample_by=args.txt_sample_by)
    return dict(source=args.source, files=files, text_field=args.text_field)


def prepare(args, command):
    enc = load_tokenizer(args.tokenizer)
    fits = "uint16" if enc.max_token_value < 2 ** 16 else "uint32"
    if args.dtype == "uint16" and fits == "uint32":
        raise SystemExit(f"--dtype=uint16 cannot hold token ids up to {enc.max_token_value}; use uint32 or auto")
    dtype = fits if args.dtype == "auto" else args.dtype
    tokenizer = tokenizer_info(enc, args.tokenizer)
    settings = dict(tokenizer_sha256=tokenizer["sha256"], dtype=dtype, source=describe_source(args),
                    val_every=args.val_every, shard_tokens=args.shard_tokens, max_tokens=args.max_tokens)
    meta = dict(format_version=VERSION, complete=False, tokenizer=tokenizer, vocab_size=enc.n_vocab, dtype=dtype,
                splits={split: dict(tokens=0, documents=0, shards=[]) for split in ("train", "val")},
                settings=settings, progress=dict(shards=0, documents_read=0, stream_state=None), command=command)
    meta = start_or_resume(args.out_dir, meta)
    if meta["complete"]:
        print(f"{args.out_dir} is already complete ({meta['splits']['train']['tokens']:,} train tokens)")
        return meta
    ds, text_field = open_source(meta["settings"]["source"])  # before anything is written
    if meta["progress"]["stream_state"] is not None:
        ds.load_state_dict(meta["progress"]["stream_state"])
    fresh = meta["progress"]["shards"] == 0
    os.makedirs(args.out_dir, exist_ok=True)
    confirmed = [name for split in meta["splits"].values() for name in split["shards"]]
    remove_outputs(args.out_dir, keep={"meta.json", *confirmed})
    write_json(os.path.join(args.out_dir, "meta.json"), meta)
    try:
        tokenize_to_shards(args, enc, meta, ds, text_field)
    except SystemExit:
        if fresh:  # bad input found while streaming: leave no partial output behind
            remove_outputs(args.out_dir)
            if not os.listdir(args.out_dir):
                os.rmdir(args.out_dir)
        raise
    return meta


def tokenize_to_shards(args, enc, meta, ds, text_field):
    progress, splits = meta["progress"], meta["splits"]
    chunks = document_chunks(ds, text_field, progress["documents_read"], args.val_every)
    buffers = {"train": [], "val": []}  # token arrays not written yet

    def flush(documents_read, stream_state):
        """Write the buffers as shard pair number progress["shards"], then record that in meta.json."""
        for split, arrays in buffers.items():
            if any(len(a) for a in arrays):
                name = f"{split}_{progress['shards']:06d}.bin"
                write_shard(os.path.join(args.out_dir, name), arrays, meta["dtype"])
                splits[split]["shards"].append(name)
            arrays.clear()
        progress.update(shards=progress["shards"] + 1, documents_read=documents_read, stream_state=stream_state)
        write_json(os.path.join(args.out_dir, "meta.json"), meta)  # only now do these shards count as written

    # tokens/s is measured from here, after the fixed cost of opening the stream (importing datasets and torch)
    t0, tokens_before = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
    last_print = t0
    position = (progress["documents_read"], progress["stream_state"])  # the stream position after the buffers
    for (train_ids, lengths, val_ids, n_val), position in tokenize_in_order(chunks, enc, meta["dtype"], args.num_proc):
        budget = args.max_tokens - splits["train"]["tokens"]
        if args.max_tokens and len(train_ids) > budget:  # keep the train tokens within --max_tokens
            train_ids, lengths = train_ids[:budget], lengths[np.cumsum(lengths) - lengths < budget]
        for split, ids, n_docs in (("train", train_ids, len(lengths)), ("val", val_ids, n_val)):
            buffers[split].append(ids)
            splits[split]["tokens"] += len(ids)
            splits[split]["documents"] += n_docs
        if args.max_tokens and splits["train"]["tokens"] >= args.max_tokens:
            break  # the final flush below writes these
        if sum(len(a) for a in buffers["train"]) >= args.shard_tokens:
            flush(*position)
        if time.time() - last_print >= 1.0:
            last_print, tokens = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
            rate = (tokens - tokens_before) / (last_print - t0)
            print(f"\r{position[0]:,} documents | {tokens:,} tokens | {rate:,.0f} tokens/s", end="", file=sys.stderr,
                  flush=True)
    elapsed = time.time() - t0
    print(file=sys.stderr)
    if position[0] == 0:
        raise SystemExit(f"--source={args.source}: no documents (the input is empty)")
    if splits["train"]["tokens"] == 0 or splits["val"]["tokens"] == 0:
        raise SystemExit(f"--source={args.source}: only {position[0]} document(s), too few for a train and a "
                         f"val split (a .txt file is one document unless --txt_sample_by=paragraph or line)")
    meta["complete"] = True
    flush(*position)  # the last shards and the completed meta.json, in one step
    train, val = splits["train"], splits["val"]
    rate = (train["tokens"] + val["tokens"] - tokens_before) / elapsed
    print(f"wrote {args.out_dir}: train {train['tokens']:,} tokens in {train['documents']:,} documents, val "
          f"{val['tokens']:,} tokens in {val['documents']:,} documents ({meta['dtype']}); {rate:,.0f} tokens/s "
          f"with --num_proc={args.num_proc}")

# -----------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description="Tokenize a corpus into train/val shards.", allow_abbrev=False)
    p.add_argument("--source", default="builtin",
                   help="fineweb-edu | builtin (offline: Python's help topics) | comma-separated paths/globs of "
                        ".txt, .jsonl/.json or .parquet files (one type per run)")
    p.add_argument("--tokenizer", default="bytes",
                   help="bytes | a tiktoken BPE file | a Llama-3 or Qwen1.5/Qwen2 checkpoint directory")
    p.add_argument("--out_dir", required=True, help="where the shards and meta.json go")
    p.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    p.add_argument("--max_tokens", type=int, default=0, help="stop after this many train tokens (0: no limit)")
    p.add_argument("--fineweb_config", default="sample-10BT", help="FineWeb-Edu config, e.g. sample-100BT")
    p.add_argument("--text_field", default="text", help="the text column of .jsonl/.json/.parquet and FineWeb-Edu")
    p.add_argument("--txt_sample_by", default="document", choices=["document", "paragraph", "line"],
                   help="what one document of a .txt file is")
    p.add_argument("--val_every", type=int, default=100, help="hold out documents 0, k, 2k, ... for validation")
    p.add_argument("--shard_tokens", type=int, default=100_000_000,
                   help="train tokens per shard (a shard ends at the first chunk boundary past this)")
    p.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"],
                   help="token storage; auto: uint16 if the vocabulary fits, else uint32")
    args = p.parse_args(argv)
    for key, low in (("num_proc", 1), ("max_tokens", 0), ("val_every", 2), ("shard_tokens", 1)):
        if getattr(args, key) < low:
            p.error(f"--{key} must be at least {low}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return prepare(parse_args(argv), shlex.join(["python", "prepare_data.py", *argv]))


if __name__ == "__main__":
    main()
