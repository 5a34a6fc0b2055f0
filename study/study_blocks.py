"""
The sink study's blocks in the docs, generated from its committed results (tests/test_findings.py
and tests/test_sink_study.py hold each to them): README.md's findings at a glance
(study_findings.readme_lines of every docs/sink_study*/results.json: a study that finishes is one
more column), docs/analysis.md's claims tables (study_results.claims_table), its pilot table
(study_results.pilot_lines of docs/sink_study/pilot/results.json) and v3's payoff pilot
(study_results.payoff_pilot_lines).

    python -m study.study_blocks           # check: exit status 1 and the blocks that differ
    python -m study.study_blocks --write   # write them between their markers (nothing else changes)
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m study.study_blocks")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from study import study_findings, study_results  # noqa: E402  (after the path: the root)
from lmkit.files import atomic_write  # noqa: E402


def results(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


# (file, start marker, end marker, the lines between them)
BLOCKS = [
    ('README.md', '<!-- the findings: study_findings.readme_lines() -->',
     '<!-- end of the findings -->', study_findings.readme_lines),
    ('docs/analysis.md', '<!-- the claims: study_results.claims_table() -->',
     '<!-- end of the claims -->', study_results.claims_table),
    ('docs/analysis.md', "<!-- v2's claims: study_results.claims_table('v2') -->",
     "<!-- end of v2's claims -->", lambda: study_results.claims_table('v2')),
    ('docs/analysis.md', "<!-- v3's claims: study_results.claims_table('v3') -->",
     "<!-- end of v3's claims -->", lambda: study_results.claims_table('v3')),
    ('docs/analysis.md', "<!-- v4's claims: study_results.claims_table('v4') -->",
     "<!-- end of v4's claims -->", lambda: study_results.claims_table('v4')),
    ('docs/analysis.md',
     "<!-- v3's payoff pilot: "
     "study_results.payoff_pilot_lines(docs/sink_study_v3/pilot/results.json) -->",
     "<!-- end of v3's payoff pilot -->",
     lambda: study_results.payoff_pilot_lines(results('docs/sink_study_v3/pilot/results.json'))),
    ('docs/analysis.md',
     '<!-- the pilot: study_results.pilot_lines(docs/sink_study/pilot/results.json) -->',
     '<!-- end of the pilot -->',
     lambda: study_results.pilot_lines(results('docs/sink_study/pilot/results.json'))),
]


def main(argv):
    stale = []
    for path, start, end, lines in BLOCKS:
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        if text.count(start) != 1 or text.count(end) != 1:
            raise SystemExit(f"{path}: expected one {start!r} and one {end!r}")
        before, rest = text.split(start)
        after = rest.split(end)[1]
        new = before + start + '\n' + '\n'.join(lines()) + '\n' + end + after
        if new != text:
            stale.append(f"{path}: {start}")
            if '--write' in argv:
                with atomic_write(os.path.join(ROOT, path)) as f:
                    f.write(new)
    verb = 'wrote' if '--write' in argv else 'out of date (python -m study.study_blocks --write)'
    print('\n'.join(f"{verb}: {s}" for s in stale) or 'every block is up to date')
    return 1 if stale and '--write' not in argv else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
