"""
Writing outputs without losing anything: atomic_write (a whole file or the previous one, never a
part), claim_dir (an output directory checked before any work), made_dirs, set_aside (an earlier log
kept, never replaced), lock_dir (one writer per run directory), read_log (a JSON-lines log read
whole lines only) and last_logged (its last step, read from the end). docs/implementation.md has the
rules. Pure Python: quickstart.py writes through it before torch is installed.
"""
import json
import math
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager

from .errors import RunError, os_error_behind

try:
    import fcntl
except ImportError:  # Windows: no flock; lock_dir then says that nothing stops a second writer
    fcntl = None


@contextmanager
def atomic_write(path, mode='w'):
    """Open path for writing ('w' text as UTF-8, or 'wb'); the file appears under its name, whole,
    when the block ends, or not at all (the previous file, if any, is kept). An OSError (or an error
    caused by one) leaves the block as that OSError with the path in it; no temporary file is left
    behind either way."""
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
        # a failed write names no file: this is the one
        if cause.errno is not None and cause.filename is None:
            cause.filename = path
        raise cause from None


@contextmanager
def made_dirs(path):
    """os.makedirs(path) for the block; if the block fails, the directories made here are removed
    again where they are still empty: a failed start leaves no empty output directory behind (a
    directory that holds a file by then is kept, with those above it)."""
    made, top = [], os.path.abspath(path)
    while not os.path.exists(top):
        made.append(top)  # the deepest first
        top = os.path.dirname(top)
    try:
        os.makedirs(path, exist_ok=True)
        yield
    except BaseException:
        for directory in made:
            try:
                os.rmdir(directory)  # only if empty
            except OSError:
                break
        raise


def check_writable(path):
    """An OSError naming path where files cannot be written there, found before any work (a report
    computed for minutes, then refused, is lost): the nearest directory at or above path that
    exists takes a file, which is removed again. Nothing else is created."""
    top = os.path.abspath(path)
    while not os.path.exists(top):
        top = os.path.dirname(top)
    try:
        fd, probe = tempfile.mkstemp(dir=top, prefix='.writable.')
    except OSError as e:  # (named by the path asked for, not the probe's)
        raise OSError(e.errno, e.strerror, path) from None
    os.close(fd)
    os.remove(probe)


def write_json(path, obj, indent=1, allow_nan=True):
    """allow_nan=False: strict JSON, a NaN or infinity is a ValueError (Python's json writes a bare
    NaN otherwise)."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False, allow_nan=allow_nan)
        f.write('\n')


def claim_dir(path, owner, ours=lambda names: False, writes=()):
    """Check, before any work, that path may be the output directory of `owner` (a script's name),
    else RunError: it must be a directory or not exist; unless ours(names) says it holds an earlier
    output of this same script, it must hold none of the files by which another tool's outputs are
    recognised (MARKERS) and none of the names in `writes` (the script would write over them). Other
    files (a user's notes) are allowed, and never touched."""
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


# the files by which the outputs of this repo's tools (and Hugging Face's) are recognised, the most
# telling first
MARKERS = {'ckpt.pt': "a train.py run", 'metrics.jsonl': "a train.py run",
           'meta.json': "prepared data (prepare_data.py)",
           'model.safetensors': "a Hugging Face model",
           'model.safetensors.index.json': "a Hugging Face model",
           'numbers.json': "an analyze.py report",
           'report.md': "a report (analyze.py or quickstart.py)",
           'config.json': "a model (a train.py run or a Hugging Face directory)"}


def set_aside(path):
    """Rename the file `path` to a free name beside it made from its last change, metrics.jsonl ->
    metrics.20250102-153000.jsonl (-1, -2, ... after it where taken), and return that name: what an
    earlier run wrote is kept, never replaced."""
    root, ext = os.path.splitext(path)
    stamp = time.strftime('%Y%m%d-%H%M%S', time.localtime(os.path.getmtime(path)))
    aside, n = f"{root}.{stamp}{ext}", 0
    while os.path.lexists(aside):
        n += 1
        aside = f"{root}.{stamp}-{n}{ext}"
    os.rename(path, aside)
    return aside


# in a directory lock_dir holds: who holds it (the lock itself is the kernel's flock on it)
LOCK_NAME = '.lock'


def lock_holder(fd):
    """Who holds the lock file open as fd, as its holder recorded it (it may not have written it
    yet)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "its pid and host not recorded yet"


def take_lock(path, owner):
    """An open descriptor of the lock file `path`, exclusively flock'ed by this process, with this
    process's pid, host and start time written in it; RunError naming the holder's if another
    process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            os.close(fd)
            raise RunError(f"{os.path.dirname(path)}: another {owner} writes there ({holder}); two "
                           "writers would interleave its files: wait for it to end (or stop it), "
                           "or write elsewhere") from None
        except OSError as e:  # a file system without locks (Lustre without -o flock, some FUSE)
            print(f"note: {path}: this file system has no file locks ({e.strerror}), so nothing "
                  f"stops a second {owner} from writing into {os.path.dirname(path)}: run one at a "
                  "time", file=sys.stderr)
            break
        # the holder removes the file as it ends: if it did after our open, lock the file now there
        # instead
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(dict(owner=owner, pid=os.getpid(), host=socket.gethostname(),
                                 since=time.strftime('%Y-%m-%d %H:%M:%S'))).encode())
    return fd


@contextmanager
def lock_dir(path, owner):
    """Hold the directory `path` (created if needed) as the only writer of `owner` (a script's name)
    while the block runs; a second process is refused with RunError, one line naming the first one's
    pid and host. The lock is flock() on path/LOCK_NAME: the kernel releases it when its process
    ends, however it ends (kill -9 included), so no stale lock can block the same command from
    continuing, and a recycled pid is never mistaken for the holder. On exit the lock file is
    removed, and where the block fails, the directories this call created if they are still empty
    (made_dirs: a start that failed before writing anything leaves nothing behind). See
    docs/training.md for shared file systems."""
    lock = os.path.join(path, LOCK_NAME)
    with made_dirs(path):
        fd = None
        try:
            if fcntl is None:
                print(f"note: {lock}: no file locks on this OS, so nothing stops a second {owner} "
                      f"from writing into {path}: run one at a time", file=sys.stderr)
            else:
                fd = take_lock(lock, owner)
            yield
        finally:
            if fd is not None:
                try:
                    # while still holding it: one that opened it meanwhile sees it gone, takes a new
                    # one
                    os.remove(lock)
                except FileNotFoundError:
                    pass
                os.close(fd)


def read_log(path):
    """The records of a JSON-lines log that a process appends to (train.py's metrics.jsonl): each
    line one JSON object with an integer 'step'; records[i] is line i + 1. A crash while appending
    can cut the last line short: such a line is dropped, with a note on stderr. Any other line that
    is not a record is a RunError naming it."""
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
        if isinstance(record, dict) and isinstance(record.get('step'), int):
            records.append(record)
        else:
            shown = line[:40].decode('utf-8', 'replace') + ('...' if len(line) > 40 else '')
            raise RunError(f"{path}: line {number} is not a record with a step ({shown!r}); only "
                           "its last line can be cut short by a crash, so the file was damaged or "
                           "edited: restore it from a copy, or delete that line")
    return records


def last_logged(out_dir):
    """(the last step out_dir/metrics.jsonl records, whether that step's loss is finite); (0, True)
    without one. Read from the end in growing blocks: an evaluation's line (every head's measures)
    can be longer than any fixed tail."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    try:
        with open(path, 'rb') as f:
            size, block = f.seek(0, os.SEEK_END), 4096
            while True:
                f.seek(max(0, size - block))
                # a block's first line may be cut
                lines = f.read().splitlines()[0 if block >= size else 1:]
                for line in reversed(lines):
                    try:
                        record = json.loads(line)
                        return record['step'], math.isfinite(record.get('loss', 0.0))
                    except (ValueError, KeyError, TypeError):
                        continue
                if block >= size:
                    break
                block *= 8
    except OSError:
        pass
    return 0, True
