"""
Faults as one line: a fault the user must act on is a RunError (its text says what to do), and a
script's entry point, run_script(main), prints it, or the OS refusing a read or a write, as one line
with exit status 1, never a traceback. Pure Python: quickstart.py uses it before torch is installed.
"""
import errno
import os
import signal
import sys
from contextlib import contextmanager


class RunError(Exception):
    """A fault of the input, the settings or the machine; its text is one line that says what to
    do."""


# what each OS fault means for a user, and what to do about it
OS_FAULTS = {
    errno.ENOSPC: ("no space left on the device",
                   "free some space (df -h shows where) or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free some space within your quota or write elsewhere"),
    errno.EROFS: ("read-only file system", "write to a writable location"),
    errno.EACCES: ("permission denied", "check the permissions (ls -ld) or write elsewhere"),
    errno.EPERM: ("operation not permitted", "check the permissions (ls -ld) or write elsewhere"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "check the path"),
    errno.EISDIR: ("is a directory, where a file was expected", "check the path"),
    errno.EIO: ("input/output error (a failing disk or network file system)",
                "check the device (dmesg)"),
}


def describe_os_error(e):
    """One line for an OSError: the path, what happened and what to do."""
    what, todo = OS_FAULTS.get(e.errno, (e.strerror or str(e), 'check the path and the device'))
    return f"{e.filename or 'a file'}: {what}; {todo}"


def os_error_behind(e):
    """The OSError that caused e, if any: torch.save, for one, reports a failed write as a
    RuntimeError whose context is the OSError the file raised."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


class Stopped(RunError):
    """SIGTERM or SIGINT (Ctrl-C) reached the script: raised where it was, so that what it started
    is stopped on the way out (a with-block's exit, an except clause that stops children) and it
    ends with one line."""


def raise_stopped(signum, frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signals(handler=raise_stopped):
    """While active, SIGTERM and SIGINT go to handler (by default: Stopped raised in the main
    thread; SIG_IGN while children save, lmkit.children.stop); the handlers before are restored
    after. (train.py's loop sets a flag instead for its steps: it finishes the step and saves
    first.)"""
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def run_script(main, argv=None):
    """A script's entry point: main(argv), with a RunError or an OSError printed as one line on
    stderr (the script's name, the path, what happened and what to do) and exit status 1. SIGTERM
    and SIGINT are such an error too (Stopped), never a traceback or a silent death; a closed pipe
    (| head) ends it quietly."""
    try:
        with on_stop_signals():
            return main(sys.argv[1:] if argv is None else argv)
    except RunError as e:
        message = str(e)
    # the reader of the output stopped early (| head): nothing to say, as Unix tools do
    except BrokenPipeError:
        # (Python's flush at exit would raise again)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except OSError as e:
        message = describe_os_error(e)
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(1)
