"""
The commands a script runs side by side (the quick start's stages, the sink study's runs), started
so that a stop reaches them through their parent alone, stopped so that each saves first, and
followed by the last step each logged (last_logged). Pure Python: quickstart.py uses it before
torch is installed.

Each child runs in a session of its own: a Ctrl-C at the terminal reaches the parent only, which
then stops its children with SIGTERM (train.py finishes its step, saves and exits). On Linux a child
also gets SIGTERM when its parent dies without doing so (SIGKILL, a crash): prctl's PR_SET_PDEATHSIG
(man 2 prctl).
"""
import ctypes
import ctypes.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

from lmkit.errors import on_stop_signals

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_WAIT = 120  # seconds a child may take to finish its step and save before it is killed


def _term_with_parent():
    """In the child, before it runs its command: SIGTERM when the parent dies (Linux; elsewhere
    nothing)."""
    libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start(command, **popen_args):
    """subprocess.Popen(command, **popen_args), in a session of its own and stopped with its
    parent."""
    linux = sys.platform.startswith('linux')
    return subprocess.Popen(command, start_new_session=True, preexec_fn=_term_with_parent if linux
                            else None, **popen_args)


def stop(processes, wait=STOP_WAIT):
    """SIGTERM to each process still running, a wait of up to `wait` seconds for all of them
    together, and SIGKILL for any still there after it; the processes that had to be killed. A
    second Ctrl-C or SIGTERM meanwhile is ignored: it would cut the wait while the children save."""
    with on_stop_signals(signal.SIG_IGN):
        return _stop(processes, wait)


def _stop(processes, wait):
    live = [p for p in processes if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline, killed = time.monotonic() + wait, []
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed.append(p)
    return killed


def last_logged(out_dir):
    """(the last step out_dir/metrics.jsonl records, whether its loss is finite), or (0, True).
    Read from the end in growing blocks: an evaluation's line can be longer than any fixed tail."""
    with suppress(OSError), open(os.path.join(out_dir, 'metrics.jsonl'), 'rb') as f:
        size, block, whole = f.seek(0, os.SEEK_END), 4096, False
        while not whole:
            whole = block >= size
            f.seek(max(0, size - block))
            lines = f.read().splitlines()[0 if whole else 1:]  # else the first may be cut
            for line in reversed(lines):
                with suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    return record['step'], math.isfinite(record.get('loss', 0.0))
            block *= 8
    return 0, True
