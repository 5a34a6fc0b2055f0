"""Writing outputs without losing anything: a file is replaced whole or not at all, an output
directory is checked before any work, an earlier log is set aside, a run directory has one writer
(docs/implementation.md). Pure Python: quickstart.py writes through it before torch is installed."""
import json
import os
import socket
import sys
import time
from contextlib import contextmanager, suppress

from .errors import RunError, os_error_behind

try:
    import fcntl
except ImportError:  # Windows: no flock; lock_dir then says that nothing stops a second writer
    fcntl = None


@contextmanager
def atomic_write(path, mode='w'):
    """Open path for writing ('w' as UTF-8 text, or 'wb'): the file appears whole when the block
    ends, or not at all. An error caused by an OSError leaves as that OSError, naming the path."""
    tmp = path + '.tmp'
    try:
        with open(tmp, mode, **({} if 'b' in mode else dict(encoding='utf-8'))) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.lexists(tmp):
            os.remove(tmp)
        cause = os_error_behind(e)
        if cause is None:
            raise
        if cause.errno is not None and cause.filename is None:  # a failed write names no file
            cause.filename = path
        raise cause from None


@contextmanager
def made_dirs(path):
    """os.makedirs(path) for the block; if the block fails, the ones made are removed if empty."""
    made, top = [], os.path.abspath(path)
    while not os.path.exists(top):
        made.append(top)  # the deepest first
        top = os.path.dirname(top)
    try:
        os.makedirs(path, exist_ok=True)
        yield
    except BaseException:
        with suppress(OSError):  # the first one not empty (or not removable) ends the removal
            for directory in made:
                os.rmdir(directory)
        raise


def write_json(path, obj, indent=1, allow_nan=True):
    """Write obj as JSON, atomically. With allow_nan=False a NaN or infinity is a ValueError."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False, allow_nan=allow_nan)
        f.write('\n')


def claim_dir(path, owner, ours=lambda names: False, writes=()):
    """RunError, before any work, unless path may be the output directory of `owner`: a new or
    empty directory, an earlier output of the same script (ours(names) says so), or one that holds
    no other tool's output (MARKERS) and none of `writes`. A user's own files are never touched."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunError(f"{path}: is a file, not a directory; {owner} writes a directory there: "
                       "give another path")
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    if not names or ours(names):
        return
    foreign = sorted(names & set(writes))
    kind = next((kind for name, kind in MARKERS.items() if name in names),
                f"files {owner} did not write")
    if foreign or kind in MARKERS.values():
        held = ', '.join(sorted((names & set(MARKERS)) | set(foreign))[:6])
        raise RunError(f"{path}: holds {kind} ({held}); {owner} writes only into a new or empty "
                       "directory or its own earlier output: give another path")


# the files that mark the outputs of this repo's tools and Hugging Face's, most telling first
MARKERS = {'ckpt.pt': "a train.py run", 'metrics.jsonl': "a train.py run",
           'meta.json': "prepared data (prepare_data.py)",
           'model.safetensors': "a Hugging Face model",
           'model.safetensors.index.json': "a Hugging Face model",
           'numbers.json': "an analyze.py report",
           'report.md': "a report (analyze.py or quickstart.py)",
           'config.json': "a model (a train.py run or a Hugging Face directory)"}


def set_aside(path):
    """Keep an earlier run's file: rename it to a free name stamped with its last change, such as
    metrics.20250102-153000.jsonl (then -1, -2 where taken), and return that name."""
    root, ext = os.path.splitext(path)
    stamp = time.strftime('%Y%m%d-%H%M%S', time.localtime(os.path.getmtime(path)))
    aside, n = f"{root}.{stamp}{ext}", 0
    while os.path.lexists(aside):
        n += 1
        aside = f"{root}.{stamp}-{n}{ext}"
    os.rename(path, aside)
    return aside


LOCK_NAME = '.lock'  # the file lock_dir flocks, which records who holds it


def take_lock(path, owner):
    """Open the lock file at path, flock it exclusively and write this process's pid, host and
    start time into it; returns the descriptor. RunError names the holder if another has it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:  # who holds it, as the holder recorded it (it may not have yet)
                holder = json.loads(os.pread(fd, 4096, 0))
                holder = f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
            except (OSError, ValueError, TypeError, KeyError):
                holder = "its pid and host not recorded yet"
            os.close(fd)
            raise RunError(f"{os.path.dirname(path)}: another {owner} writes there ({holder}); two "
                           "writers would interleave its files: wait for it to end (or stop it), "
                           "or write elsewhere") from None
        except OSError as e:  # a file system without locks (Lustre without -o flock, some FUSE)
            print(f"note: {path}: this file system has no file locks ({e.strerror}), so nothing "
                  f"stops a second {owner} from writing into {os.path.dirname(path)}: run one at a "
                  "time", file=sys.stderr)
            break
        # The holder removes the file as it ends. If it did so after our open, lock the new file.
        with suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(dict(owner=owner, pid=os.getpid(), host=socket.gethostname(),
                                 since=time.strftime('%Y-%m-%d %H:%M:%S'))).encode())
    return fd


@contextmanager
def lock_dir(path, owner):
    """Hold the directory at path (made_dirs) as the only writer of `owner` during the block. The
    kernel releases its flock() however the process ends (kill -9 too), so no stale lock blocks a
    resume (docs/training.md, "One writer per run directory")."""
    lock = os.path.join(path, LOCK_NAME)
    with made_dirs(path):
        if fcntl is None:
            print(f"note: {lock}: no file locks on this OS, so nothing stops a second {owner} "
                  f"from writing into {path}: run one at a time", file=sys.stderr)
        fd = None if fcntl is None else take_lock(lock, owner)
        try:
            yield
        finally:
            if fd is not None:
                with suppress(FileNotFoundError):  # removed while held: a later opener sees it gone
                    os.remove(lock)
                os.close(fd)


def read_log(path):
    """The records of a JSON-lines log that a process appends to, such as metrics.jsonl: records[i]
    is line i + 1, a JSON object with an integer 'step'. A crash while appending can cut the last
    line short: that line is dropped with a note, and any other bad line is a RunError."""
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    if lines[-1] == b'':  # the file ends with a newline (or is empty)
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:  # not JSON (or not UTF-8): as the last line, one cut short
            if number == len(lines):
                print(f"note: {path}: line {number}, the last, is cut short (the writer was "
                      "stopped while writing it): dropped", file=sys.stderr)
                break
            record = None
        if not (isinstance(record, dict) and isinstance(record.get('step'), int)):
            shown = line[:40].decode('utf-8', 'replace') + ('...' if len(line) > 40 else '')
            raise RunError(f"{path}: line {number} is not a record with a step ({shown!r}); only "
                           "its last line can be cut short by a crash, so the file was damaged or "
                           "edited: restore it from a copy, or delete that line")
        records.append(record)
    return records
