"""
A blind study's seal: report_dir/seal.json names the commit that fixed its claims, tests, recipe,
seeds, stopping rule and report before its first run, when it was committed, and the sha256 of every
file it held outside docs/. study/sink_study.py trains a blind study (--claims=v2) only where each
of those files is as sealed, and every record it writes stores the seal's commit; tests/test_seal.py
holds the records to it (docs/analysis.md, "The seal").

    python -m study.seal_study --commit=<the seal commit> --report_dir=docs/sink_study_v2
"""
import datetime
import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m study.seal_study")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from configurator import Key, parse  # noqa: E402  (after the path: the repository's root)
from lmkit.errors import RunError, run_script  # noqa: E402
from lmkit.files import claim_dir, write_json
from study.study_records import SEAL_FILE, read_seal  # noqa: E402


def git(*args, text=True):
    out = subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=text)
    if out.returncode != 0:
        raise RunError(f"git {' '.join(args)}: "
                       f"{out.stderr.strip() if text else out.stderr.decode().strip()}")
    return out.stdout


def seal_of(commit):
    """{commit, committed, files} of a commit: its committer time in UTC and every file outside
    docs/ it holds."""
    commit = git('rev-parse', '--verify', f'{commit}^{{commit}}').strip()
    stamp = int(git('show', '-s', '--format=%ct', commit))
    committed = datetime.datetime.fromtimestamp(stamp,
                                                datetime.timezone.utc).isoformat(timespec='seconds')
    paths = [p for p in git('ls-tree', '-r', '--name-only', '-z', commit).split('\0') if p and
             not p.startswith('docs/')]
    files = {p: hashlib.sha256(git('show', f'{commit}:{p}', text=False)).hexdigest() for p in paths}
    return dict(commit=commit, committed=committed, files=files)


def main(argv=None):
    keys = dict(commit=Key(None, "the seal commit (any name git knows it "
                                 "by)", types=(str,), required=True),
                report_dir=Key(None, "the sealed study's report directory (its seal.json is "
                                     "written there)",
                               types=(str,), required=True))
    args = parse(sys.argv[1:] if argv is None else argv, keys, __doc__.split('\n\n')[1],
                 prog='python -m study.seal_study')
    out = os.path.join(ROOT, args['report_dir'])
    if read_seal(out) is not None:
        raise RunError(f"{args['report_dir']}/{SEAL_FILE} exists: a study is sealed once")
    claim_dir(out, 'study/seal_study.py', writes=[SEAL_FILE], ours=lambda names: False)
    seal = seal_of(args['commit'])
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, SEAL_FILE), seal)
    print(f"wrote {args['report_dir']}/{SEAL_FILE}: {seal['commit']} ({seal['committed']}), "
          f"{len(seal['files'])} files")


if __name__ == '__main__':
    run_script(main)
