"""Faults as one line, never a traceback: run_script(main) prints a RunError, which says what to
do, or an OSError. Pure Python, because quickstart.py uses it before torch is installed."""
import errno
import os
import signal
import sys
from contextlib import contextmanager, suppress


class RunError(Exception):
    """A fault of the input, the settings or the machine, in one line that says what to do."""

    def again(self, message):
        """The same fault, said with `message` (a stop keeps its signal, hence its exit status)."""
        return type(self)(message)


OS_FAULTS = {  # what each OS fault means for a user, and what to do about it
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
    what, todo = OS_FAULTS.get(e.errno, (e.strerror or str(e), 'check the path and the device'))
    return f"{e.filename or 'a file'}: {what}; {todo}"


def os_error_behind(e):
    """The OSError that caused e, if any (torch.save raises a RuntimeError caused by one)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


class Stopped(RunError):
    """A stop signal or a closed stdout, raised where the script was so that what it started stops.
    Its exit status, 128 + signum, stops a shell's a && b there too."""

    def __init__(self, message, signum=signal.SIGTERM):
        super().__init__(message)
        self.signum = signum

    def again(self, message):
        return Stopped(message, self.signum)


def stop_name(signum):
    return signal.Signals(signum).name


def raise_stopped(signum, frame):
    raise Stopped(f"stopped by {stop_name(signum)}", signum)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the terminal or ssh closed
# the exit status of a program one stopped: 128 + signum if it saved first, -signum if it was killed
STOP_STATUSES = {128 + s: s for s in STOP_SIGNALS} | {-s: s for s in STOP_SIGNALS}


def output_closed():
    """Point stdout at /dev/null once its reader has gone, so that later prints do not raise."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def print_or_stop(line, flag):
    """print(line); if stdout's reader has gone, flag SIGPIPE so that the loop saves and stops."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        output_closed()
        flag.append(signal.SIGPIPE)


def stopped_after_save(flag, say, saved):
    """The Stopped a loop ends with once a flagged stop made it save: the first signal flagged, and
    what it saved (`saved`, in words). With say=False it says nothing (the ranks but the first)."""
    signum = flag[0] if flag else signal.SIGTERM  # (another rank got it)
    why = (f"stopped by {stop_name(signum)}" if signum != signal.SIGPIPE else
           "stopped: its standard output was closed (the reader of it, say | head, ended)")
    return Stopped(f"{why}: {saved}" if say else '', signum)


@contextmanager
def on_stop_signals(handler=raise_stopped):
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def run_script(main, argv=None):
    """Run main(argv) as a script's entry point: a RunError or OSError prints one line and exits 1,
    a stop prints its line (if any) and exits 128 + signum, a closed stdout exits 141 quietly."""
    try:
        with on_stop_signals():
            return main(sys.argv[1:] if argv is None else argv)
    except RunError as e:  # a stop exits 128 + its signal's number
        status, message = (128 + e.signum if isinstance(e, Stopped) else 1), str(e)
    except BrokenPipeError:  # stdout's reader stopped early (| head): quiet, as Unix tools are
        output_closed()
        status, message = 128 + signal.SIGPIPE, ''
    except OSError as e:
        status, message = 1, describe_os_error(e)
    if message:
        with suppress(OSError):  # stderr closed too: the status alone says it
            print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(status)
