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

    def again(self, message):
        """The same fault, said with `message` (a stop keeps its signal, hence its exit status)."""
        return type(self)(message)


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
    """A stop reached the script: SIGTERM, SIGINT (Ctrl-C) or SIGHUP (a closed terminal), raised
    where it was, so that what it started is stopped on the way out (a with-block's exit, an except
    clause that stops children) and it ends with one line; or its standard output was closed
    (SIGPIPE's number: a reader such as | head ended). run_script exits with 128 + signum, as
    shells report a program a signal ended, so that a chain (a && b) stops there too."""

    def __init__(self, message, signum=signal.SIGTERM):
        super().__init__(message)
        self.signum = signum

    def again(self, message):
        return Stopped(message, self.signum)


def stop_name(signum):
    """'SIGTERM', ...: the name a stop's message gives its signal."""
    return signal.Signals(signum).name


def raise_stopped(signum, frame):
    raise Stopped(f"stopped by {stop_name(signum)}", signum)


# the signals that stop a script cleanly (SIGHUP: the terminal or the ssh connection closed)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# a program that exits with one of these was stopped by that signal (128 + its number), and saved
# what it had done first; the status shells give a program the signal killed, when negative
STOP_STATUSES = {128 + s: s for s in STOP_SIGNALS} | {-s: s for s in STOP_SIGNALS}
OUTPUT_CLOSED = "stopped: its standard output was closed (the reader of it, say | head, ended)"


def output_closed():
    """A closed stdout (BrokenPipeError) as the stop it is: stdout is pointed at /dev/null, so that
    what the script still prints, and Python's flush at exit, do not raise again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return Stopped(OUTPUT_CLOSED, signal.SIGPIPE)


def print_or_stop(line, flag):
    """print(line) on stdout; where its reader has gone (| head), SIGPIPE appended to flag (a loop's
    stop flag, lmkit.distributed.preemption_flag's kind): a stop, as a signal is, which the loop
    ends with a save, where a write that raised would lose the steps since the last one."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        output_closed()
        flag.append(signal.SIGPIPE)


def stopped_after_save(flag, say, saved):
    """The Stopped a loop ends with once a flagged stop (preemption_flag, print_or_stop) had it
    save: why (the first signal flagged; SIGPIPE: a closed stdout) and what it saved (`saved`, in
    words); say=False: no words (the ranks but the one that says it). Exit status 128 + that
    signal's number, as had the signal ended the process."""
    signum = flag[0] if flag else signal.SIGTERM  # (another rank got it)
    why = OUTPUT_CLOSED if signum == signal.SIGPIPE else f"stopped by {stop_name(signum)}"
    return Stopped(f"{why}: {saved}" if say else '', signum)


@contextmanager
def on_stop_signals(handler=raise_stopped):
    """While active, the STOP_SIGNALS go to handler (by default: Stopped raised in the main thread;
    SIG_IGN while children save, lmkit.children.stop); the handlers before are restored after.
    (train.py's loop sets a flag instead for its steps: it finishes the step and saves first.)"""
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def run_script(main, argv=None):
    """A script's entry point: main(argv), with a RunError or an OSError printed as one line on
    stderr (the script's name, the path, what happened and what to do) and exit status 1. A stop
    (Stopped: a STOP_SIGNALS signal) is such a line too, never a traceback or a silent death, with
    exit status 128 + its signal's number; an empty message says nothing (the other ranks of a run
    whose rank 0 says it). A closed stdout ends it quietly with SIGPIPE's (141)."""
    status = 1
    try:
        with on_stop_signals():
            return main(sys.argv[1:] if argv is None else argv)
    except Stopped as e:
        status, message = 128 + e.signum, str(e)
    except RunError as e:
        message = str(e)
    except BrokenPipeError:
        # The reader of stdout stopped early (| head): quiet, as Unix tools are, with the status a
        # shell gives a writer that SIGPIPE ended. (A loop that saved first says so: train.py,
        # print_or_stop.)
        output_closed()
        status, message = 128 + signal.SIGPIPE, ''
    except OSError as e:
        message = describe_os_error(e)
    if message:
        try:
            print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
        except OSError:  # stderr closed too: the status alone says it
            pass
    raise SystemExit(status)
