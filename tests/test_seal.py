"""The seal of the confirmatory study, v2 (issue 44; docs/analysis.md, "The seal"): one commit fixed
its claims, tests, recipe, seeds, stopping rule and report before its first run. Every v2 record
stores that commit and started after it; the runner trains a blind study only from the sealed files;
and the claims table and the tests' outputs on fixed fixture records are what they were at the seal,
wherever the code that computes them later moves."""
import collections
import datetime
import hashlib
import json
import os
import re
import types
import subprocess

import pytest

from study import sink_study
from study import study_records
from study import study_results
from lmkit.errors import RunError
from helpers import seal_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V2 = os.path.join(ROOT, 'docs', 'sink_study_v2')
# per sealed study: its report folders (one per plan), its fixture (records of a short run of its
# plan and the tests' outputs on them), and the sha256 at the seal of claims_table(set) for each of
# its claim sets and of the canonical JSON of test_claims(fixture records, its first set)
SEALS = dict(
    v2=dict(dirs=['sink_study_v2'], fixture='v2_sealed', records=48,
            tables=dict(v2='516d4945385956c8dad38d1cb59da08092c0d6f209be08a060a92e8ba8265589'),
            outputs='ddeefef2805413771122e1949d008f7ddad2a3ee5f606456818954993c08a3cd'),
    v3=dict(dirs=['sink_study_v3', 'sink_study_v3_gpu'], fixture='v3_sealed', records=48,
            tables=dict(v3='a4f074e1886bbe9b5d6f176058b5c8d4e2c8a18d5a32dc9720ee1eaca974506e',
                        v3_gpu='701e67e43358cf51f62efdf89f1c09b05bd77666d5a143cef5ec875305dc17ea'),
            outputs='f631786f7d98b78d5b0a1fd833319f1364b017094fcd32edbc9de3ffb317a7e3'),
    v4=dict(dirs=['sink_study_v4'], fixture='v4_sealed', records=72,
            tables=dict(v4='a937cdf64cae305fa937d91b33ba9024c40805ae2022e1a0aa30dab76ea6847c'),
            outputs='2580cde85bd575d9ef4e103672eb6652a5f75946811a2b3af8a8bb6cc1d7e0ff'),
)
REPORT_DIRS = [d for seal in SEALS.values() for d in seal['dirs']]


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(',', ':'), allow_nan=False)


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize('study', SEALS)
def test_the_claims_tables_are_the_sealed_ones(study):
    for claim_set, digest in SEALS[study]['tables'].items():
        assert sha256('\n'.join(study_results.claims_table(claim_set))) == digest, claim_set


@pytest.mark.parametrize('study', SEALS)
def test_the_tests_outputs_on_the_fixture_records_are_the_sealed_ones(study):
    """Records of the plan (4 variants x 12 seeds and its teachers) from a short run of it, their
    measures as trained: test_claims gives what it gave at the seal, each p, interval, verdict and
    word (its canonical JSON is committed beside them and pinned by hash)."""
    seal = SEALS[study]
    fixture = os.path.join(ROOT, 'tests', 'fixtures', seal['fixture'])
    with open(os.path.join(fixture, 'records.json')) as f:
        records = json.load(f)
    with open(os.path.join(fixture, 'claims.json')) as f:
        sealed = json.load(f)
    assert len(records) == seal['records']
    assert {r['arm'] for r in records} <= {'kd', 'teacher', study_results.DECAY}
    outputs = json.loads(canonical(study_results.test_claims(records, next(iter(seal['tables'])))))
    assert outputs == sealed
    assert sha256(canonical(outputs)) == seal['outputs']
    assert any(r['verdict'].startswith('supported') for r in outputs) and any(
        r['verdict'].startswith('not decided') for r in outputs)


def committed_seal(report_dir):
    seal = study_records.read_seal(os.path.join(ROOT, 'docs', report_dir))
    if seal is None:
        pytest.skip(f"docs/{report_dir}/seal.json is written in the commit after the seal "
                    "(study/seal_study.py)")
    return seal


@pytest.mark.parametrize('report_dir', REPORT_DIRS)
def test_the_seal_is_named_in_the_docs_and_describes_its_commit(report_dir):
    seal = committed_seal(report_dir)
    with open(os.path.join(ROOT, 'docs', 'analysis.md')) as f:
        assert f"sealed at commit {seal['commit']}" in f.read()
    known = subprocess.run(['git', 'cat-file', '-e', f"{seal['commit']}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip("this clone does not hold the seal commit (a shallow clone)")
    from study import seal_study
    assert seal_study.seal_of(seal['commit']) == seal


@pytest.mark.parametrize('report_dir', REPORT_DIRS)
def test_every_record_started_after_the_seal_and_names_it(report_dir):
    seal = committed_seal(report_dir)
    sealed = datetime.datetime.fromisoformat(seal['committed'])
    runs = os.path.join(ROOT, 'docs', report_dir, 'runs')
    records = study_records.read_records(runs) if os.path.isdir(runs) else {}
    for name, record in records.items():
        assert record['seal'] == seal['commit'], name
        assert datetime.datetime.fromisoformat(record['started']) > sealed, name
        if report_dir not in ('sink_study_v2', 'sink_study_v3', 'sink_study_v3_gpu'):
            # since v4 a record keeps its first launch's start: the seal came before it
            assert datetime.datetime.fromisoformat(record['first_started']) > sealed, name
        assert record['dirty'] is False and re.fullmatch(r'[0-9a-f]{40}', record['commit']), name


BLIND = ['--variants=softmax', '--arms=kd', '--kd_seeds=1', '--teachers=101', '--claims=v2',
         '--tokens=2048',
         '--teacher_config=config/sink_study_v2_teacher.py',
         '--config=config/sink_study.py,config/sink_study_v2.py',
         '--block_size=32', '--compile=False', '--eval_batches=2', '--jobs=1']


def test_a_blind_study_trains_only_under_its_seal(study_data, tmp_path):
    """Without a seal.json, or with one file differing from the seal, a blind study stops before any
    run with one line naming the file and the checkout to train from; under its seal, every record
    stores the seal's commit. The same two runs test --teacher_config (v2's larger teachers; one
    study for both saves training them twice): the teacher is a run of its own shape and seed,
    recorded in the teacher arm under teacher_softmax_s<seed> with its own settings; the student
    names it; the report says how much larger it is, from the runs' settings; v2's config layers the
    recipe's rules on v1's (matched_init, no_decay, a constant learning rate)."""
    out = tmp_path / 'out'
    argv = [f'--out_dir={out}', f'--data_dir={study_data}', *BLIND]
    with pytest.raises(RunError, match=r"^the v2 claims are tested only by a sealed study, and "
                                       r".*seal\.json is not " r"there"):
        sink_study.main([*argv, f'--report_dir={tmp_path / "unsealed"}'])
    with pytest.raises(RunError, match=r"^1 file\(s\) differ from the seal aaaaaaaaaaaa "
                                       r"\(train\.py\): train the "
                                       r"sealed study from a checkout .*git worktree add .*, then "
                                       r"there, python -m "
                                       r"study\.sink_study with the same arguments$"):
        sink_study.main([*argv,
                         f"--report_dir={seal_here(tmp_path / 'changed' / 'report', 'train.py')}"])
    # v2's sealed commit predates study/: its checkout runs the root's sink_study.py (issue 53: the
    # advice led to a checkout without the command it named)
    with pytest.raises(RunError, match=r"then there, python sink_study\.py with the same "
                                       r"arguments$"):
        sink_study.check_seal(types.SimpleNamespace(claims='v2', report_dir='docs/sink_study_v2'))
    assert not (out / 'train').exists()
    report = seal_here(tmp_path / 'report')
    results = sink_study.main([*argv, f'--report_dir={report}'])
    records = study_records.read_records(str(report / 'runs'))
    assert sorted(records) == ['kd_softmax_s1', 'teacher_softmax_s101']
    assert all(r['seal'] == 'a' * 40 for r in records.values()) and results['claim_set'] == 'v2'
    teacher, student = records['teacher_softmax_s101'], records['kd_softmax_s1']
    shape = lambda record: tuple(record['settings'][k] for k in ('n_layer', 'n_embd', 'seed'))
    assert teacher['arm'] == 'teacher' and shape(teacher) == (6, 192, 101)  # its config's
    assert student['teacher'] == 'teacher_softmax_s101' and shape(student) == (4, 128, 1)
    for record in (teacher, student):
        assert record['settings']['matched_init'] and record['no_decay'] == ['alpha_proj', 'g_proj']
        assert record['settings']['decay_frac'] == 0.0
    assert results['teachers'] == ['teacher_softmax_s101'] and results['arms'] == ['kd', 'teacher']
    # the embeddings (320 x width, tied) and the final norm once, and per layer q and o (width x
    # width), k and v (width x the 2 kv heads' 64), the MLP (3 x width x its hidden) and two norms
    count = lambda width, layers, hidden: (320 * width + width + layers * (
        2 * width * width + 2 * width * 64 + 3 * width * hidden + 2 * width))
    assert count(128, 4, 384) == 828_544  # the student's (softmax: no parameter of its own)
    ratio = count(192, 6, 576) / count(128, 4, 384)
    assert (f"KD arm: students distilled from softmax teachers {ratio:.2f}x "
            "the students' parameters" in (report / 'report.md').read_text())


def test_a_seal_that_is_not_one_is_one_line(tmp_path):
    (tmp_path / 'seal.json').write_text(json.dumps(dict(commit='HEAD', committed='now', files={})))
    with pytest.raises(RunError, match=r"seal\.json: not a seal \(it needs commit \(40 hexadecimal "
                                       r"digits\)"):
        study_records.read_seal(str(tmp_path))


NUMBER = r'[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?'
BOLD = r'\*\*[^*]+\*\*'  # a verdict as the report writes it: **supported (p = 0.00635)**
READING = '## What the records say beyond the registered claims (exploratory)'
# the paragraphs of the sealed report that the report now gives as bullets (issue 63)
AS_BULLETS = ('In the KD arm', 'This design has')  # what the study found, its confounds
# the sealed count of parameters there is softmax's alone (issue 63)
STUDENTS = r"The students: .*?the paper's scale\."


def without_the_reading(text):
    """A report less its reading's section, added after the runs (issue 50: not sealed)."""
    start = text.find(READING)
    return text if start < 0 else text[:start] + text[text.index('\n## ', start) + 1:]


@pytest.mark.parametrize('study, runs', [('sink_study_v2', 50), ('sink_study_v3', 52),
                                         ('sink_study_v4', 78)])
def test_every_sealed_verdict_and_number_is_in_the_report_regenerated_here(study, runs):
    """A sealed study's report as its sealed checkout wrote it, once, after its last run
    (report_at_seal.md), against report.md, which this checkout's code regenerates from the same
    records (--report_only=True), and which now opens with its table, figures and sentences and
    gives its long paragraphs as bullets (issue 63); the reading, added after the runs (issue 50),
    left out of both. Every line of the sealed report is in it as it was (each claim's line, each
    table's row, the command, the corpus, the tests), but, for v2, the two lines where the layout
    moved (`python sink_study.py` became `python -m study.sink_study`, significance.py
    study/significance.py), and the paragraphs given as bullets, each of whose clauses is in it
    word for word; the students' sentence now names every variant's parameters (the sealed count,
    softmax's, among them); and every number and every bold verdict of the sealed report is in the
    regenerated one at least as often."""
    sealed, here = (open(os.path.join(ROOT, 'docs', study, name), encoding='utf-8').read()
                    for name in ('report_at_seal.md', 'report.md'))
    assert f'({runs} runs)' in sealed.splitlines()[2] and READING in here
    sealed, here = without_the_reading(sealed), without_the_reading(here)
    lines = set(here.splitlines())
    layout = lambda line: line.replace('`python sink_study.py ', '`python -m study.sink_study ') \
        .replace('(fixed before the runs; significance.py)', '(fixed before the runs; '
                                                            'study/significance.py)')
    moved = [line for line in sealed.splitlines() if line and line not in lines]
    bullets = [line for line in moved if line.startswith(AS_BULLETS)]
    assert len(bullets) == 2 and [layout(line) in lines for line in moved
                                  if line not in bullets] == ([True] * 2 if '2' in study else [])
    students = re.findall(STUDENTS, sealed)
    for line in bullets:
        # (the two-sided comparisons now have a bullet each, by what they compare)
        for clause in re.split(r'(?<=[.;:]) |, and two-sided \(', re.sub(STUDENTS, '', line)):
            clause = clause.rstrip('.;:')  # one after a ';' may now open its bullet (v4)
            clause = clause[:-1] if clause.count(')') > clause.count('(') else clause  # the list's
            assert clause in here or clause[0].upper() + clause[1:] in here, clause
    regenerated = next(line for line in lines if line.startswith('- The students: '))
    assert len(students) == 1 and all(n in re.findall(NUMBER, regenerated)
                                      for n in re.findall(NUMBER, students[0]))
    for pattern in (NUMBER, BOLD):
        assert not collections.Counter(re.findall(pattern, sealed)) - collections.Counter(
            re.findall(pattern, here)), pattern


# -----------------------------------------------------------------------------
# v3 (issue 50): the whole claim set, sealed, on fresh seeds; two plans under one seal

def test_v3_holds_every_claim_v1_or_v2_tested():
    """No claim is dropped: every test (measure, variants, direction) of v1's and v2's sets is one
    of v3's and of v3_gpu's, and each claim names whose reading it is; v3's primary family adds the
    held-out loss and the share in softmax's sink layers to the paper's seven."""
    earlier = {c[3:] for c in study_results.CLAIMS + study_results.CLAIMS_V2}
    for claims in (study_results.CLAIMS_V3, study_results.CLAIMS_V3_GPU):
        assert earlier <= {c[3:] for c in claims}
        assert len({c[0] for c in claims}) == len(claims) == len({c[3:] for c in claims})
        assert all(re.search(r"\((the paper's|our reading|v1's reading)|^(Gu|Qiu) et al\.|^the "
                             r"payoff", c[2])
                   for c in claims), [c[2] for c in claims if '(' not in c[2]]
        primary = {c[3:] for c in claims if c[1] == 'primary'}
        assert {('val_loss', 'affine', '<', 'softmax'), ('share_sink', 'affine', '<', 'sink'),
                ('share_sink', 'sink', '<', 'softmax')} <= primary
    assert {f'weight_l{k}' for k in range(1, 9)} <= {c[3] for c in study_results.CLAIMS_V3_GPU}


def used_seeds(later=('v3', 'v3_gpu', 'v4', 'custom')):
    """Every seed a committed plan (but the later ones), the v2 recipe search (its logs), the GPU
    plan's first attempt or the v3 pilot used."""
    seeds = set()
    for name, plan in sink_study.PLANS.items():
        if name not in later:
            seeds |= {*plan.get('seeds', [1, 2, 3]), *plan.get('kd_seeds', [1, 2, 3]),
                      *plan.get('teachers', [1, 2]),
                      *plan.get('extra_seeds', []), *plan.get('control_seeds', []), 0}
    search = os.path.join(V2, 'search')
    for name in os.listdir(search):
        with open(os.path.join(search, name)) as f:
            seeds |= {int(s) for s in re.findall(r'seed[=": ]+(\d+)', f.read())}
    attempt = os.path.join(ROOT, 'docs', 'sink_study_gpu', 'attempt_1', 'runs')
    seeds |= {int(name.rsplit('_s', 1)[1][:-5]) for name in os.listdir(attempt)}
    return seeds


@pytest.mark.parametrize('plan', ['v3', 'v3_gpu'])
def test_v3_runs_on_fresh_seeds_more_teachers_and_reaches_holms_floor(plan):
    """Students and teachers on seeds no plan, search or attempt has used (the two plans on
    different ones), more than two teachers each teaching as many students, and enough pairs that
    the exact sign-flip test can pass Holm's strictest level over the primary family: 2 / 2^n < 0.05
    / m (docs/analysis.md gives n and m)."""
    p = sink_study.PLANS[plan]
    students, teachers = set(p['kd_seeds']), set(p['teachers'])
    assert not (students | teachers) & used_seeds() and not students & teachers
    other = sink_study.PLANS['v3_gpu' if plan == 'v3' else 'v3']
    assert not (students | teachers) & {*other['kd_seeds'], *other['teachers']}
    assert len(teachers) > 2 and len(students) % len(teachers) == 0
    m = sum(c[1] == 'primary' for c in study_results.CLAIM_SETS[p['claims']][0])
    n = len(students)
    assert 2 / 2 ** n < 0.05 / m
    with open(os.path.join(ROOT, 'docs', 'analysis.md')) as f:
        assert f"{plan}: n = {n} pairs, m = {m} primary claims" in f.read()


# -----------------------------------------------------------------------------
# v4 (issue 60): affine against the head-wise gate, the decay arm, six teachers; sealed


def test_v4_runs_on_fresh_seeds_under_six_teachers():
    """Students and teachers on seeds no earlier plan, search, attempt or pilot has used, v3's and
    v3_gpu's included; six teachers, each teaching two students, fixed by the plan."""
    p = sink_study.PLANS['v4']
    students, teachers = set(p['kd_seeds']), set(p['teachers'])
    earlier = used_seeds(later=('v4', 'custom'))
    assert not (students | teachers) & earlier and not students & teachers
    assert len(teachers) == 6 and len(students) == 12
    args, _ = sink_study.parse_args(['--plan=v4'])
    taught = collections.Counter(sink_study.teacher_of(s, args) for s in students)
    assert sorted(taught) == [f'teacher_softmax_s{t}' for t in sorted(teachers)]
    assert set(taught.values()) == {2}
