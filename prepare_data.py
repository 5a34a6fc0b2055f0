"""Tokenize a corpus with the teacher's tokenizer into train/val token shards, once (docs/data.md):

    python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes \\
        --val_every=10                       # the CPU quick start's: Python's docs, byte tokens
    python prepare_data.py --source=fineweb-edu --fineweb_config=sample-100BT \\
        --tokenizer=checkpoints/Llama-3.2-3B --out_dir=data/fineweb_edu_llama3 \\
        --max_tokens=20_000_000_000          # the paper's 20B tokens, the teacher's tokenizer
    python prepare_data.py --source=docs/*.jsonl --tokenizer=checkpoints/SmolLM2-360M \\
        --out_dir=data/smollm2               # your files, any byte-level BPE tokenizer directory
"""
import glob
import hashlib
import json
import logging
import multiprocessing
import os
import queue
import re
import shlex
import signal
import sys
import sysconfig
import threading
import time
import zlib
from collections import deque, namedtuple
from multiprocessing import resource_tracker
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import numpy as np

from configurator import Key, parse
from lmkit.errors import (STOP_SIGNALS, RunError, Stopped, on_stop_signals, raise_stopped,
                          run_script)
from lmkit.files import atomic_write, write_json
from lmkit.data import HEADER, MAGIC, REBUILD, VERSION, check_shard, map_shard
from lmkit.data_meta import check_meta, tokenizer_files
from lmkit.tokenizer import encode_documents, load_tokenizer, tokenizer_info

# load_tokenizer lives in tokenizer.py; it stays importable from here, a public entry point kept for
# existing users (`from prepare_data import load_tokenizer, read_shard`)
__all__ = ["load_tokenizer", "read_shard", "main"]

# -----------------------------------------------------------------------------------------------
# Shards: lmkit/data.py reads them (the format: docs/data.md)

def write_shard(path, arrays, dtype):
    """Write the concatenation of `arrays` as one shard, atomically. Returns its checksum as
    meta.json records it: 'crc32:' and the whole file's CRC-32 in 8 hex digits."""
    dtype = np.dtype(dtype).newbyteorder("<")
    with atomic_write(path, "wb") as f:
        data = HEADER.pack(MAGIC, VERSION, dtype.itemsize, sum(len(a) for a in arrays))
        f.write(data)
        crc = zlib.crc32(data)
        for a in arrays:
            data = np.asarray(a, dtype=dtype).tobytes()
            f.write(data)
            crc = zlib.crc32(data, crc)
    return f"crc32:{crc:08x}"


def read_shard(path):
    """A shard's ids as a read-only np.memmap, its header checked (read_split checks the rest)."""
    ids, fault = map_shard(path)
    if fault:
        raise RunError(f"{fault}; {REBUILD}")
    return ids


# -----------------------------------------------------------------------------------------------
# Sources: every source is a `datasets` IterableDataset, so reading is streamed (memory does not
# grow with the dataset) and its state_dict() lets an interrupted run resume without re-reading
# finished data.

BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def builtin_corpus():
    """The offline corpus: the Python Language Reference help topics that ship with every Python
    (pydoc_data.topics, what help('assert') shows; ~0.5 MB of English prose and code), one document
    per topic."""
    from pydoc_data.topics import topics
    return [topics[name] for name in sorted(topics)]


def stdlib_files():
    """The offline corpus for study/sink_study.py: every .py file of the running Python's standard
    library (sysconfig's stdlib directory, its tests included, installed packages not), in sorted
    order: ~1,800 files, ~31 MB on CPython 3.11. Other Python versions have other files, so the
    corpus's sha256 is recorded with it."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs
                         if d not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(folder, name) for name in sorted(names) if name.endswith(".py")]
    return root, files


def stdlib_corpus():
    """(documents, description): the text of every stdlib_files() file that is UTF-8 (a few test
    files are not, on purpose), one document per file, with the files' count, bytes and sha256 over
    (path, bytes) in order."""
    root, files = stdlib_files()
    h, documents, skipped, size = hashlib.sha256(), [], 0, 0
    for path in files:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            documents.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            skipped += 1
            continue
        name = os.path.relpath(path, root).encode()
        h.update(b"%d %s %d\n" % (len(name), name, len(raw)) + raw)
        size += len(raw)
    return documents, dict(files=len(documents), bytes=size, sha256=h.hexdigest(), not_utf8=skipped)


def resolve_files(source):
    """The files named by a comma-separated list of paths and globs, in the order given (globs
    sorted)."""
    files = []
    for pattern in source.split(","):
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise RunError(f"--source: {pattern!r} matches no file")
        for f in matches:
            if not os.path.isfile(f) or os.path.splitext(f)[1] not in BUILDERS:
                raise RunError(f"--source: {f!r} is not a file with a supported extension "
                               f"({', '.join(BUILDERS)})")
            if os.path.getsize(f) == 0:  # (the json builder stops with a bare StopIteration on one)
                raise RunError(f"--source: {f!r} is empty (0 bytes); leave it out of --source")
            files.append(os.path.abspath(f))
    if len({BUILDERS[os.path.splitext(f)[1]] for f in files}) > 1:
        raise RunError("--source: mixes file types; run prepare_data.py once per type")
    return files


def open_source(source_info):
    """The document stream as (IterableDataset, name of its text column)."""
    import datasets  # slow to import, so only here
    # its JSON reader logs an error before it raises it, which document_chunks reports in one line
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    source = source_info["source"]
    if source == "fineweb-edu":
        try:
            ds = datasets.load_dataset("HuggingFaceFW/fineweb-edu",
                                       name=source_info["fineweb_config"],
                                       split="train", streaming=True)
        except (OSError, ValueError) as e:  # offline, or no such config
            raise RunError(f"--source=fineweb-edu: cannot open HuggingFaceFW/fineweb-edu "
                           f"({source_info['fineweb_config']}): {e}")
        return ds, source_info["text_field"]
    if source == "builtin":
        return datasets.Dataset.from_dict({"text": builtin_corpus()}).to_iterable_dataset(), "text"
    if source == "stdlib":
        return datasets.Dataset.from_dict(
            {"text": stdlib_corpus()[0]}).to_iterable_dataset(), "text"
    files = source_info["files"]
    builder = BUILDERS[os.path.splitext(files[0])[1]]
    if builder == "text":  # the text builder always names its column "text"
        ds = datasets.load_dataset("text", data_files=files, split="train", streaming=True,
                                   sample_by=source_info["txt_sample_by"])
        return ds, "text"
    return datasets.load_dataset(builder, data_files=files, split="train",
                                 streaming=True), source_info["text_field"]


def where_in_source(source_info, text_field, index):
    """Where the first row whose text field is missing or not a string is: 'row N of FILE', counting
    from 1. The stream does not say which file a row came from, so the files are read again, one at
    a time, up to that row; a source of no files (FineWeb-Edu) gives how many documents came before
    it."""
    import datasets
    for path in source_info.get("files", []):
        rows = datasets.load_dataset(BUILDERS[os.path.splitext(path)[1]], data_files=[path],
                                     split="train", streaming=True)
        row_number = next((n for n, r in enumerate(rows, 1)
                           if not isinstance(r.get(text_field), str)), None)
        if row_number is not None:
            return f"row {row_number} of {path}"
    return f"--source={source_info['source']}, after {index:,} documents"


def describe_value(value):
    """'null', 'an object', 'a list', 'a number', ...: what a row's field or a JSON value holds, in
    words."""
    kinds = {dict: "an object", list: "a list", bool: "a boolean", int: "a number",
             float: "a number", str: "a string"}
    return "null" if value is None else kinds.get(type(value), f"a {type(value).__name__}")


def not_a_string(row, text_field, index, source_info):
    """The error for a row whose text field holds something else than text (a list, a number,
    null)."""
    return (f"{where_in_source(source_info, text_field, index)}: field {text_field!r} is "
            f"{describe_value(row[text_field])}, not a string; pass the field that holds the text "
            f"as --text_field=NAME (fields: {', '.join(row)})")


def not_json(e):
    """A json.JSONDecodeError in words, as json says it: 'not valid JSON: Expecting value: column
    7'."""
    return f"not valid JSON: {e.msg}: column {e.colno}"


def unreadable(source_info):
    """The first line of the source's files that is not UTF-8, or not JSON in a .json/.jsonl file:
    'line N of FILE: ...', counting from 1 as editors do (what `datasets` says names neither, and
    counts JSON rows from 0), or None. A .json file that starts with '[' is one JSON array (as
    `datasets` reads it), any other JSON Lines."""
    for path in source_info.get("files", []):
        # (its strings are checked UTF-8 when written)
        if BUILDERS[os.path.splitext(path)[1]] == "parquet":
            continue
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    return (f"line {n} of {path}: not UTF-8 (byte 0x{line[e.start]:02x} at byte "
                            f"{e.start + 1} of the line); convert the file to UTF-8 (e.g. iconv -f "
                            "latin1 -t utf-8)")
        if BUILDERS[os.path.splitext(path)[1]] != "json":
            continue
        with open(path, encoding="utf-8-sig") as f:
            if f.read(1) == "[":
                f.seek(0)
                try:
                    json.load(f)
                except json.JSONDecodeError as e:
                    return f"line {e.lineno} of {path}: {not_json(e)}; fix the file"
                continue
            f.seek(0)
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line.rstrip("\r\n")) if line.strip() else {}
                except json.JSONDecodeError as e:
                    return (f"line {n} of {path}: {not_json(e)}; each line of a JSON Lines file "
                            "must be one JSON object")
                if not isinstance(row, dict):
                    return (f"line {n} of {path}: {describe_value(row)}, not an object; each line "
                            "of a JSON Lines file must be one JSON object")
    return None


# documents are tokenized in chunks of about 1M characters (one task for a worker)
CHUNK_CHARS = 1 << 20


def document_chunks(ds, text_field, first_index, val_every, source_info):
    """Group the stream into chunks of whole documents, in stream order. Chunk boundaries depend
    only on the data, so the output does not depend on --num_proc. Document i (counting non-empty
    documents from 0) is held out for validation when i % val_every == 0. Yields (docs, (documents
    read so far, stream state))."""
    docs, n_chars, index = [], 0, first_index
    try:
        for row in ds:
            if text_field not in row:
                raise RunError(f"{where_in_source(source_info, text_field, index)}: no such text "
                               f"field {text_field!r}; pass the field that holds the text as "
                               f"--text_field=NAME (fields: {', '.join(row)})")
            text = row[text_field]
            if not isinstance(text, str):
                raise RunError(not_a_string(row, text_field, index, source_info))
            if text:
                docs.append((index % val_every == 0, text))
                index += 1
                n_chars += len(text)
            if n_chars >= CHUNK_CHARS:
                yield docs, (index, ds.state_dict())
                docs, n_chars = [], 0
    # unreadable input: bad JSON, not UTF-8, columns that differ between files, ...
    except ValueError as e:
        raise RunError(unreadable(source_info) or f"--source: cannot read the input: {e}") from e
    if docs:
        yield docs, (index, ds.state_dict())

# -----------------------------------------------------------------------------
# Parallel tokenization

# set by init_worker in each worker (in this process for --num_proc=1)
worker_enc, worker_dtype = None, None


def init_worker(enc, dtype):
    global worker_enc, worker_dtype
    worker_enc, worker_dtype = enc, dtype


def tokenize_chunk(docs):
    """-> (train token ids, train document lengths, bytes dropped from each train document, val
    token ids, number of val documents, bytes dropped from them): a vocabulary without a token for
    every byte drops those bytes, as Hugging Face's tokenizer does
    (tokenizer.Tokenizer.encode_lossy)"""
    train, val, train_dropped, val_dropped = [], [], [], 0
    encoded = encode_documents(worker_enc, [text for _, text in docs])
    for (is_val, text), ids in zip(docs, encoded):
        (val if is_val else train).append(np.array(ids, dtype=worker_dtype))
        if is_val:
            val_dropped += worker_enc.dropped_bytes(text)
        else:
            train_dropped.append(worker_enc.dropped_bytes(text))
    join = lambda arrays: np.concatenate(arrays) if arrays else np.empty(0, worker_dtype)
    return (join(train), np.array([len(a) for a in train], dtype=np.int64),
            np.array(train_dropped, dtype=np.int64), join(val), len(val), val_dropped)


def worker_loop(tasks, results, enc, dtype):
    """A worker process: tokenizes each chunk read from `tasks` and sends (True, result), or (False,
    the exception it raised), to `results`, until the parent closes its end. A thread reads the
    chunks as they come, so a parent sending one never waits for this worker to finish the last:
    with each side waiting to write, both pipes full, neither would go on."""
    init_worker(enc, dtype)
    queued = queue.SimpleQueue()

    def read_ahead():
        try:
            while True:
                queued.put(tasks.recv())
        except EOFError:
            queued.put(None)

    threading.Thread(target=read_ahead, daemon=True).start()
    while (docs := queued.get()) is not None:
        try:
            reply = True, tokenize_chunk(docs)
        except Exception as e:  # raised again in the parent, as if it had tokenized the chunk
            reply = False, e
        try:
            results.send(reply)
        except BrokenPipeError:
            return


# a worker process and the parent's ends of its two pipes
Worker = namedtuple("Worker", "process tasks results")


def start_worker(context, enc, dtype):
    task_reader, task_writer = context.Pipe(duplex=False)
    result_reader, result_writer = context.Pipe(duplex=False)
    process = context.Process(target=worker_loop, args=(task_reader, result_writer, enc, dtype),
                              daemon=True)
    process.start()
    task_reader.close()
    result_writer.close()
    return Worker(process, task_writer, result_reader)


def worker_died(process):
    process.join()
    code = process.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return RunError(f"a tokenizer worker (pid {process.pid}) died ({how}); if memory ran out, "
                    "pass a smaller --num_proc")


def send(worker, docs):
    try:
        worker.tasks.send(docs)
    except BrokenPipeError:
        raise worker_died(worker.process) from None


def receive(worker):
    """The result of the oldest chunk a worker holds, or the exception it raised, raised here."""
    try:
        ok, result = worker.results.recv()
    except EOFError:
        raise worker_died(worker.process) from None
    if not ok:
        raise result
    return result


def tokenize_in_order(chunks, enc, dtype, num_proc):
    """Yields (tokenize_chunk(docs), tag) for each (docs, tag), in order: chunk i goes to worker
    i % num_proc, which holds at most 2, so memory stays bounded and no worker waits for its next
    chunk while the caller writes."""
    if num_proc == 1:
        init_worker(enc, dtype)
        for docs, tag in chunks:
            yield tokenize_chunk(docs), tag
        return
    # spawn: workers start clean instead of inheriting the parent's threads (pyarrow) through fork.
    # SIGINT and SIGTERM are the parent's to handle: it kills the workers on its way out and says
    # so in one line (a Ctrl-C at the terminal reaches the whole foreground group, a batch system's
    # SIGTERM every process of the job). The workers inherit both blocked from their first
    # instruction (a signal mask survives exec); one arriving while they start is held, then
    # raised. They hold no lock the parent needs, so killing them cannot leave it waiting
    # (multiprocessing.Pool's terminate could).
    context, workers, held = multiprocessing.get_context("spawn"), [], []
    # (the first spawn starts multiprocessing's resource tracker, which unblocks both signals in
    # the parent once it has: started first, it leaves the mask alone)
    resource_tracker.ensure_running()
    try:
        with on_stop_signals(lambda signum, frame: held.append(signum)):
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                for _ in range(num_proc):
                    workers.append(start_worker(context, enc, dtype))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if held:
            raise_stopped(held[0], None)
        pending = deque()  # (worker, tag) of each chunk sent and not yet received, oldest first
        for i, (docs, tag) in enumerate(chunks):
            send(workers[i % num_proc], docs)
            pending.append((workers[i % num_proc], tag))
            if len(pending) > num_proc:
                worker, done = pending.popleft()
                yield receive(worker), done
        while pending:
            worker, tag = pending.popleft()
            yield receive(worker), tag
    finally:
        for worker in workers:
            worker.process.kill()
            worker.process.join()
            worker.tasks.close()
            worker.results.close()

# -----------------------------------------------------------------------------------------------
# The output directory: shards train_000000.bin, val_000000.bin, ... and meta.json, which is
# rewritten (atomically) after every pair of shards and records the progress an interrupted run
# resumes from.


# the only files this script writes
OUTPUT_NAME = re.compile(r"(meta\.json|(train|val)_\d{6}\.bin)(\.tmp)?")


def remove_outputs(out_dir, keep=()):
    """Delete this script's files in out_dir except `keep`: the unconfirmed shards of an interrupted
    run, or everything when a fresh run fails on bad input. Files of other names are never
    touched."""
    for name in os.listdir(out_dir):
        if name not in keep and OUTPUT_NAME.fullmatch(name):
            os.remove(os.path.join(out_dir, name))


def start_or_resume(out_dir, meta):
    """The meta to continue from: `meta` for a fresh run, or out_dir's meta.json if it was made with
    the same tokenizer and settings. Anything else in out_dir is an error, so shards are never mixed
    up."""
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RunError(f"--out_dir={out_dir} is a file; give a new or empty directory")
    if not os.path.exists(meta_path):
        if os.path.isdir(out_dir) and any(not OUTPUT_NAME.fullmatch(name)
                                          for name in os.listdir(out_dir)):
            raise RunError(f"--out_dir={out_dir} is not empty and has no meta.json; use an empty "
                           "or new directory")
        return meta
    try:
        with open(meta_path) as f:
            old = json.load(f)
    except ValueError:
        old = None
    if not (isinstance(old, dict) and "settings" in old and "sha256" in old.get("tokenizer", {})):
        raise RunError(f"--out_dir={out_dir} holds a meta.json that prepare_data.py did not write; "
                       "use an empty or new directory")
    check_meta(old, meta_path)  # (a field edited to another type: named, not a traceback)
    if old["tokenizer"]["sha256"] != meta["tokenizer"]["sha256"]:
        old_tok = old["tokenizer"]
        raise RunError(f"--out_dir={out_dir} holds shards of a different tokenizer "
                       f"({old_tok['family']} from {old_tok['spec']}, n_vocab "
                       f"{old_tok['n_vocab']}); use another --out_dir")
    changed = [key for key in meta["settings"] if old["settings"].get(key) != meta["settings"][key]]
    if changed:
        raise RunError(f"--out_dir={out_dir} was prepared with different settings "
                       f"({', '.join(changed)}); use another --out_dir")
    return old


def first_fault(out_dir, meta):
    """What is wrong with the first shard meta.json lists that is missing or damaged
    (data.check_shard), or None."""
    for split in meta["splits"].values():
        for name in split["shards"]:
            _, fault = check_shard(os.path.join(out_dir, name), meta.get("checksums", {}).get(name),
                                   meta["vocab_size"])
            if fault:
                return fault
    return None


def describe_source(args):
    """Everything that determines the document stream; recorded in meta.json and checked on
    resume."""
    if args.source == "fineweb-edu":
        return dict(source=args.source, fineweb_config=args.fineweb_config,
                    text_field=args.text_field)
    if args.source == "builtin":  # the help topics differ between Python versions
        return dict(source=args.source, python=sys.version.split()[0])
    if args.source == "stdlib":  # and so do the standard library's sources: their sha256 says which
        return dict(source=args.source, python=sys.version.split()[0], corpus=stdlib_corpus()[1])
    files = resolve_files(args.source)
    if BUILDERS[os.path.splitext(files[0])[1]] == "text":
        return dict(source=args.source, files=files, txt_sample_by=args.txt_sample_by)
    return dict(source=args.source, files=files, text_field=args.text_field)


def add_tokenizer_files(out_dir, meta, files, spec):
    """Add files, the tokenizer files of --tokenizer=spec, to the sets that out_dir's meta.json
    records as building its tokenizer, where they are not among them yet (data prepared before
    the record existed, or another copy of the same tokenizer). The caller has checked that spec
    builds the tokenizer whose sha256 meta.json records, so distill.py may then accept spec as a
    teacher by its files alone. meta.json is rewritten at once, atomically."""
    known = meta["tokenizer"].get("files", [])
    if not files or files[0] in known:
        return
    meta["tokenizer"]["files"] = known + files
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(f"{out_dir}: recorded the files of --tokenizer={spec} in meta.json (the tokenizer the "
          "data was prepared with, by its sha256), so distill.py accepts it as a teacher")


def open_run(args, command):
    """(tokenizer, meta to continue from, the document stream where it continues, its text field);
    the stream None where out_dir is complete already. Nothing is written, except the tokenizer's
    files added to the meta.json of an out_dir prepared before (add_tokenizer_files)."""
    enc = load_tokenizer(args.tokenizer)
    fits = "uint16" if enc.max_token_value < 2 ** 16 else "uint32"
    if args.dtype == "uint16" and fits == "uint32":
        raise RunError(f"--dtype=uint16 cannot hold token ids up to {enc.max_token_value}; use "
                       "uint32 or auto")
    dtype = fits if args.dtype == "auto" else args.dtype
    tokenizer = tokenizer_info(enc, args.tokenizer)
    # the sha256 of each file it was built from (none for 'bytes' and a tiktoken file), against
    # which distill.py checks a Hugging Face teacher without building its tokenizer
    tokenizer["files"] = ([tokenizer_files(args.tokenizer)] if os.path.isdir(args.tokenizer)
                          else [])
    settings = dict(tokenizer_sha256=tokenizer["sha256"], dtype=dtype, source=describe_source(args),
                    val_every=args.val_every, shard_tokens=args.shard_tokens,
                    max_tokens=args.max_tokens)
    fresh = dict(format_version=VERSION, complete=False, tokenizer=tokenizer,
                 vocab_size=enc.n_vocab, dtype=dtype,
                 splits={split: dict(tokens=0, documents=0, dropped_bytes=0, shards=[])
                         for split in ("train", "val")},
                 checksums={}, settings=settings,
                 progress=dict(shards=0, documents_read=0, stream_state=None), command=command)
    meta = start_or_resume(args.out_dir, fresh)
    fault = meta is not fresh and first_fault(args.out_dir, meta)
    if fault:  # the stream state of each shard is not kept, so the shards are all written again
        print(f"note: {fault}: rebuilding {args.out_dir}, reading --source again from the "
              "start", file=sys.stderr)
        meta = fresh
    if meta is not fresh:
        add_tokenizer_files(args.out_dir, meta, tokenizer["files"], args.tokenizer)
    if meta["complete"]:
        names = [name for split in meta["splits"].values() for name in split["shards"]]
        unchecked = sum(name not in meta.get("checksums", {}) for name in names)
        print(f"{args.out_dir} is already complete ({meta['splits']['train']['tokens']:,} train "
              f"tokens); its {len(names)} shards are whole"
              + (f" ({unchecked} without a checksum: prepared before checksums were recorded, "
                 "checked for ids below the vocabulary size only)" if unchecked else ""))
        return enc, meta, None, None
    ds, text_field = open_source(meta["settings"]["source"])  # before anything is written
    if meta["progress"]["stream_state"] is not None:
        ds.load_state_dict(meta["progress"]["stream_state"])
    return enc, meta, ds, text_field


def usable_cores():
    """The cores this process may run on: a container or taskset may give it fewer than the machine
    has (os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every OS)
        return os.cpu_count() or 1


def capped_num_proc(num_proc):
    """--num_proc, at most the usable cores, with a note where that lowers it: more tokenizer
    processes than cores only take turns on them, each starting and holding its own tokenizer and
    chunks."""
    cores = usable_cores()
    if num_proc <= cores:
        return num_proc
    print(f"note: --num_proc={num_proc} is more than the cores this process may use ({cores}): "
          f"tokenizing with --num_proc={cores}", file=sys.stderr)
    return cores


def prepare(args, command):
    args.num_proc = capped_num_proc(args.num_proc)
    try:
        enc, meta, ds, text_field = open_run(args, command)
    except Stopped as e:
        raise e.again(f"{e} before this run wrote anything: {args.out_dir} is as it "
                      "was") from None
    if ds is None:
        return meta
    started = meta["progress"]["shards"] > 0
    made = not os.path.isdir(args.out_dir)  # by this run: removed again if it keeps nothing there
    os.makedirs(args.out_dir, exist_ok=True)
    confirmed = [name for split in meta["splits"].values() for name in split["shards"]]
    remove_outputs(args.out_dir, keep={"meta.json", *confirmed})
    write_json(os.path.join(args.out_dir, "meta.json"), meta)
    progress_line = ProgressLine()
    try:
        tokenize_to_shards(args, enc, meta, ds, text_field, progress_line)
    except Stopped as e:  # the shards meta.json lists are whole: kept, for the same command
        progress_line.end()
        raise e.again(f"{e}; {kept_after_stop(args.out_dir, made)}") from None
    except RunError:  # its message starts on a line of its own
        progress_line.end()
        if not started:  # bad input found while streaming: leave no partial output behind
            remove_outputs(args.out_dir)
            if made:
                os.rmdir(args.out_dir)
        raise
    return meta


def kept_after_stop(out_dir, made):
    """What a stop leaves in out_dir, said in words: the shards meta.json lists, whole, which the
    same command continues from (any written after its last update are removed, as a resume would);
    none at all: this run's files removed, and out_dir where this run made it."""
    with open(os.path.join(out_dir, "meta.json")) as f:
        meta = json.load(f)
    shards = [name for split in meta["splits"].values() for name in split["shards"]]
    remove_outputs(out_dir, keep={"meta.json", *shards})
    if shards:
        return (f"kept {meta['progress']['shards']} shard pair(s) written whole in {out_dir} "
                f"({meta['splits']['train']['tokens']:,} train tokens, "
                f"{meta['progress']['documents_read']:,} documents read): the same command "
                "continues from them")
    remove_outputs(out_dir)
    if made and not os.listdir(out_dir):
        os.rmdir(out_dir)
    return "no shard was written whole, so nothing was kept: the same command starts again"


class ProgressLine:
    """A line on stderr rewritten in place (\r); end() finishes it, once, if it was written."""
    def __init__(self):
        self.open = False

    def show(self, text):
        print(f"\r{text}", end="", file=sys.stderr, flush=True)
        self.open = True

    def end(self):
        if self.open:
            print(file=sys.stderr)
            self.open = False


def tokenize_to_shards(args, enc, meta, ds, text_field, progress_line):
    progress, splits = meta["progress"], meta["splits"]
    chunks = document_chunks(ds, text_field, progress["documents_read"], args.val_every,
                             meta["settings"]["source"])
    buffers = {"train": [], "val": []}  # token arrays not written yet

    def flush(documents_read, stream_state):
        """Write the buffers as shard pair number progress["shards"], then record that in
        meta.json."""
        for split, arrays in buffers.items():
            if any(len(a) for a in arrays):
                name = f"{split}_{progress['shards']:06d}.bin"
                # (a meta.json written before checksums were recorded gets them for the shards
                # written from now on)
                meta.setdefault("checksums", {})[name] = write_shard(
                    os.path.join(args.out_dir, name), arrays, meta["dtype"])
                splits[split]["shards"].append(name)
            arrays.clear()
        progress.update(shards=progress["shards"] + 1, documents_read=documents_read,
                        stream_state=stream_state)
        # only now do these shards count as written
        write_json(os.path.join(args.out_dir, "meta.json"), meta)

    # tokens/s is measured from here, after the fixed cost of opening the stream (importing datasets
    # and torch)
    t0, tokens_before = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
    last_print = t0
    # the stream position after the buffers
    position = (progress["documents_read"], progress["stream_state"])
    for (train_ids, lengths, train_dropped, val_ids, n_val,
         val_dropped), position in tokenize_in_order(
            chunks, enc, meta["dtype"], args.num_proc):
        budget = args.max_tokens - splits["train"]["tokens"]
        if args.max_tokens and len(train_ids) > budget:  # keep the train tokens within --max_tokens
            # (the last document kept is cut, its dropped bytes counted)
            kept = np.cumsum(lengths) - lengths < budget
            train_ids, lengths = train_ids[:budget], lengths[kept]
            train_dropped = train_dropped[kept]
        for split, ids, n_docs, dropped in (("train", train_ids, len(lengths),
                                             int(train_dropped.sum())),
                                            ("val", val_ids, n_val, val_dropped)):
            buffers[split].append(ids)
            splits[split]["tokens"] += len(ids)
            splits[split]["documents"] += n_docs
            # (a meta.json written before this count existed resumes counting from 0)
            splits[split]["dropped_bytes"] = splits[split].get("dropped_bytes", 0) + dropped
        if args.max_tokens and splits["train"]["tokens"] >= args.max_tokens:
            break  # the final flush below writes these
        if sum(len(a) for a in buffers["train"]) >= args.shard_tokens:
            flush(*position)
        if time.time() - last_print >= 1.0:
            last_print, tokens = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
            rate = (tokens - tokens_before) / (last_print - t0)
            progress_line.show(f"{position[0]:,} documents | {tokens:,} tokens | {rate:,.0f} "
                               "tokens/s")
    elapsed = time.time() - t0
    progress_line.end()
    if position[0] == 0:
        raise RunError(f"--source={args.source}: no documents (the input is empty)")
    if splits["train"]["tokens"] == 0 or splits["val"]["tokens"] == 0:
        raise RunError(f"--source={args.source}: only {position[0]} document(s), too few for a "
                       "train and a val split (a .txt file is one document unless "
                       "--txt_sample_by=paragraph or line)")
    meta["complete"] = True
    flush(*position)  # the last shards and the completed meta.json, in one step
    train, val = splits["train"], splits["val"]
    rate = (train["tokens"] + val["tokens"] - tokens_before) / elapsed
    print(f"wrote {args.out_dir}: train {train['tokens']:,} tokens in {train['documents']:,} "
          f"documents, val {val['tokens']:,} tokens in {val['documents']:,} documents "
          f"({meta['dtype']}); {rate:,.0f} tokens/s with --num_proc={args.num_proc}")
    dropped = train["dropped_bytes"] + val["dropped_bytes"]
    if dropped:
        how = f"encoded as its unk_token {enc.unk[0]!r}" if enc.unk else "dropped"
        print(f"the tokenizer's vocabulary has no token for {len(enc.missing)} single bytes: "
              f"{dropped:,} bytes of the corpus were {how}, as its Hugging Face tokenizer does "
              "(meta.json: splits' dropped_bytes)")

# -----------------------------------------------------------------------------


KEYS = dict(
    source=Key("builtin", "fineweb-edu | builtin | stdlib (offline) | paths/globs of .txt, .jsonl "
                          "or .parquet (docs/data.md)"),
    tokenizer=Key("bytes", "bytes | a tiktoken BPE file | a Hugging Face directory's byte-level "
                           "BPE (docs/data.md)"),
    out_dir=Key(None, "where the shards and meta.json go", types=(str,), required=True),
    num_proc=Key(usable_cores(), "tokenizer processes (at most the cores this process may use)",
                 min=1),
    max_tokens=Key(0, "stop after this many train tokens (0: no limit)", min=0),
    fineweb_config=Key("sample-10BT", "FineWeb-Edu config, e.g. sample-100BT"),
    text_field=Key("text", "the text column of .jsonl/.json/.parquet and FineWeb-Edu"),
    txt_sample_by=Key("document", "what one document of a .txt file is",
                      choices=("document", "paragraph", "line")),
    val_every=Key(100, "hold out documents 0, k, 2k, ... for validation", min=2),
    shard_tokens=Key(100_000_000, "train tokens per shard (a shard ends at the first chunk "
                                  "boundary past this)", min=1),
    dtype=Key("auto", "token storage; auto: uint16 if the vocabulary fits, else uint32",
              choices=("auto", "uint16", "uint32")),
)


def parse_args(argv):
    return SimpleNamespace(**parse(argv, KEYS, "Tokenize a corpus into train/val shards.",
                                   prog="prepare_data.py"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return prepare(parse_args(argv), shlex.join(["python", "prepare_data.py", *argv]))


if __name__ == "__main__":
    run_script(main)
