"""
How the tools print what they measure: Markdown tables on stdout (print_table, ratio), progress on
stderr (log), so that a run's output pasted into docs/benchmarks.md is its tables alone.
"""
import os
import sys


def log(message):
    """A progress line on stderr: stdout holds the Markdown tables."""
    print(message, file=sys.stderr, flush=True)


def ratio(x, base):
    return f'{x / base:.2f}' if base else '-'


def print_table(title, notes, header, rows):
    """One section: a heading, what was measured and how, and a Markdown table of already formatted
    cells."""
    print(f'\n## {title}\n\n{notes}\n')
    print('| ' + ' | '.join(header) + ' |')
    print('|' + '---|' * len(header))
    for row in rows:
        print('| ' + ' | '.join(row) + ' |')
    sys.stdout.flush()


def not_a_command(doc, argv=None):
    """What a module the tools import says when run as one (python -m tools.tables): its docstring
    on --help (exit status 0); otherwise that it has nothing to run (exit status 2), where it once
    printed nothing at all."""
    argv = sys.argv[1:] if argv is None else argv
    if argv in (['-h'], ['--help']):
        print(f"{doc.strip()}\n\nA module the tools import: it has no command of its own.")
        raise SystemExit(0)
    print(f"error: {os.path.basename(sys.argv[0])} is a module the tools import, with no command "
          "of its own (--help says what it holds)", file=sys.stderr)
    raise SystemExit(2)


if __name__ == '__main__':
    not_a_command(__doc__)
