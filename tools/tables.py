"""
How the tools print what they measure: Markdown tables on stdout (print_table, ratio), progress on
stderr (log), so that a run's output pasted into docs/benchmarks.md is its tables alone.
"""
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
