"""
The data the tools time short runs on: the offline built-in corpus in byte tokens, prepared by
prepare_data.py run as a process (a script is never imported).
"""
import os
import subprocess
import sys

from lmkit.errors import RunError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare_builtin(out_dir):
    """The built-in corpus at out_dir; a RunError with prepare_data.py's last line if it fails."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, 'prepare_data.py'),
                           '--source=builtin', '--tokenizer=bytes', f'--out_dir={out_dir}',
                           '--val_every=10', '--num_proc=1'], capture_output=True, text=True)
    if done.returncode:
        raise RunError(f"preparing {out_dir} failed: "
                       f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")


if __name__ == '__main__':
    from tools.tables import not_a_command
    not_a_command(__doc__)
