"""
Writing outputs without losing anything, and faults as one line. Every file a script writes goes through
atomic_write: a temporary file beside it, fsync'd, renamed over the old one only once it is whole, so a crash, a
full disk or an exception leaves the previous file as it was and no temporary file behind. Every output directory
is first claimed (claim_dir): a directory that holds another tool's outputs, or a file under a name this script
would write that it did not write, is refused before any work; one that a failed run made is removed (made_dirs).
A script's entry point is run_script(main): a fault the user must act on (RunError, or the OS refusing a read or a
write) is printed as one line naming the path, what happened and what to do, with exit status 1, instead of a
traceback.
Pure Python on purpose: quickstart.py writes through it before torch is installed, and exports ship it.
"""
import errno
import json
import os
import sys
from contextlib import contextmanager


class RunError(Exception):
    """A fault of the input, the settings or the machine; its text is one line that says what to do."""


# what each OS fault means for a user, and what to do about it
OS_FAULTS = {
    errno.ENOSPC: ("no space left on the device", "free some space (df -h shows where) or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free some space within your quota or write elsewhere"),
    errno.EROFS: ("read-only file system", "write to a writable location"),
    errno.EACCES: ("permission denied", "check the permissions (ls -ld) or write elsewhere"),
    errno.EPERM: ("operation not permitted", "check the permissions (ls -ld) or write elsewhere"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "check the path"),
    errno.EISDIR: ("is a directory, where a file was expected", "check the path"),
    errno.EIO: ("input/output error (a failing disk or network file system)", "check the device (dmesg)"),
}


def describe_os_error(e):
    """One line for an OSError: the path, what happened and what to do."""
    what, todo = OS_FAULTS.get(e.errno, (e.strerror or str(e), 'check the path and the device'))
    return f"{e.filename or 'a file'}: {what}; {todo}"


def os_error_behind(e):
    """The OSError that caused e, if any: torch.save, for one, reports a failed write as a RuntimeError whose
    context is the OSError the file raised."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


@contextmanager
def atomic_write(path, mode='w'):
    """Open path for writing ('w' text as UTF-8, or 'wb'); the file appears under its name, whole, when the block
    ends, or not at all (the previous file, if any, is kept). An OSError (or an error caused by one) leaves the
    block as that OSError with the path in it; no temporary file is left behind either way."""
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
        if cause.errno is not None and cause.filename is None:  # a failed write names no file: this is the one
            cause.filename = path
        raise cause from None


@contextmanager
def made_dirs(path):
    """os.makedirs(path) for the block; if the block fails, the directories made here are removed again where they
    are still empty: a failed start leaves no empty output directory behind (a directory that holds a file by then
    is kept, with those above it)."""
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


def write_json(path, obj, indent=1):
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write('\n')


def claim_dir(path, owner, ours=lambda names: False, writes=()):
    """Check, before any work, that path may be the output directory of `owner` (a script's name), else RunError:
    it must be a directory or not exist; unless ours(names) says it holds an earlier output of this same script,
    it must hold none of the files by which another tool's outputs are recognised (MARKERS) and none of the names
    in `writes` (the script would write over them). Other files (a user's notes) are allowed, and never touched."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunError(f"{path}: is a file, not a directory; {owner} writes a directory there: give another path")
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    if not names or ours(names):
        return
    foreign = sorted(names & set(writes))
    kind = next((kind for name, kind in MARKERS.items() if name in names), f"files {owner} did not write")
    if foreign or kind in MARKERS.values():
        held = ', '.join(sorted((names & set(MARKERS)) | set(foreign))[:6])
        raise RunError(f"{path}: holds {kind} ({held}); {owner} writes only into a new or empty directory or its own "
                       f"earlier output: give another path")


# the files by which the outputs of this repo's tools (and Hugging Face's) are recognised, the most telling first
MARKERS = {'ckpt.pt': "a train.py run", 'metrics.jsonl': "a train.py run", 'meta.json': "prepared data (prepare_data.py)",
           'model.safetensors': "a Hugging Face model", 'model.safetensors.index.json': "a Hugging Face model",
           'numbers.json': "an analyze.py report", 'report.md': "a report (analyze.py or quickstart.py)",
           'config.json': "a model (a train.py run or a Hugging Face directory)"}


def run_script(main, argv=None):
    """A script's entry point: main(argv), with a RunError or an OSError printed as one line on stderr (the
    script's name, the path, what happened and what to do) and exit status 1."""
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except RunError as e:
        message = str(e)
    except OSError as e:
        message = describe_os_error(e)
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(1)
