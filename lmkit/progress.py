"""
How long work has left, said as it goes: a time as 2h05m or 3m07s (duration), and a progress line
rewritten in place (Progress). Pure Python: the quick start uses it before torch is installed.
"""
import sys
import time


def duration(seconds):
    """2h05m, 3m07s: a time left, at the steps' recent pace."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """One line on stderr, rewritten in place at most twice a second (and at the end)."""

    def __init__(self, name, total):
        self.name, self.total, self.t0, self.shown = name, total, time.time(), 0.0

    def __call__(self, done):
        now = time.time()
        if done != self.total and now - self.shown < 0.5:
            return
        self.shown = now
        rate = done / max(now - self.t0, 1e-9)
        left = f", {duration((self.total - done) / rate)} left" if 0 < done < self.total else ''
        end = '\n' if done == self.total else ''
        print(f"\r{self.name}: {done}/{self.total} "
              f"({rate:.1f}/s{left})", end=end, file=sys.stderr, flush=True)
