"""v4 (issue 60) and the custom plan: the decay arm, the held-out set of 16x v3's tokens, the
teacher-level test, a run's first start kept across launches, and a variant a user brings run
through the whole study (a copy of the repository whose model.py gains an attention defined
here)."""
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import types

import pytest

from study import sink_study, study_records, study_results
from study.study_results import AFFINE, AFFINE_DECAY, DECAY, HEADWISE, SINK, SOFTMAX

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan_args(plan, *extra):
    args, _ = sink_study.parse_args([f'--plan={plan}', *extra])
    return args


def test_v4_plans_its_decay_arm_under_v1s_rule_with_the_kd_arms_seeds_and_teachers():
    """The decay arm trains affine on the kd arm's seeds, each from the same teacher, with
    config/sink_study_decay.py after the recipe (every matrix decays: no_decay empty); every other
    v4 run keeps v3's rule (alpha_proj and g_proj without decay). Every variant, the head-wise gate
    included, takes the kd seeds."""
    args = plan_args('v4')
    matrix = sink_study.run_matrix(args)
    kd = {(v, s) for arm, v, s in matrix if arm == 'kd'}
    assert kd == {(v, s) for v in (SOFTMAX, SINK, 'gated', AFFINE, HEADWISE)
                  for s in range(601, 613)}
    assert [(v, s) for arm, v, s in matrix if arm == DECAY] == [(AFFINE, s)
                                                               for s in range(601, 613)]
    runs, _, _ = sink_study.plan_runs(args, [])
    by_name = {r['name']: r for r in runs}
    for seed in range(601, 613):
        decay, kd_run = by_name[f'decay_affine_s{seed}'], by_name[f'kd_affine_s{seed}']
        teacher = f'teacher_softmax_s{700 + (seed - 1) % 6 + 1}'  # 2 students each, fixed
        assert decay['teacher'] == kd_run['teacher'] == teacher
        assert decay['config'].no_decay == [] and kd_run['config'].no_decay == ['alpha_proj',
                                                                               'g_proj']
        assert decay['argv'].index(sink_study.DECAY_CONFIG) == len(args.config)
    assert sorted(r['name'] for r in runs if r['arm'] == 'teacher') == [
        f'teacher_softmax_s{s}' for s in range(701, 707)]
    with open(os.path.join(ROOT, sink_study.DECAY_CONFIG)) as f:
        assert 'no_decay = []' in f.read()


def test_a_decay_record_must_decay_every_matrix():
    """A decay-arm record names its teacher and an empty no_decay; v3's rule in it is refused."""
    record = dict(arm=DECAY, variant=AFFINE, seed=601, teacher='teacher_softmax_s705',
                  no_decay=[], name='decay_affine_s601')
    study_records.check_identity(record)
    with pytest.raises(study_records.Invalid, match=r"no_decay is \["):
        study_records.check_identity(dict(record, no_decay=study_records.NO_DECAY))
    with pytest.raises(study_records.Invalid, match='names its teacher'):
        study_records.check_identity(dict(record, teacher=None))


def fake_run(arm, variant, seed, teacher, weight, heldout):
    """The fields the claims read, for a run of a matched pair."""
    return dict(arm=arm, variant=variant, seed=seed, teacher=teacher,
                settings=dict(matched_init=True), first_token_weight=[weight, weight],
                end=dict(heldout=dict(loss=heldout, windows=4096, tokens=4096 * 128)))


def test_a_claim_on_the_decay_arm_pairs_its_runs_with_the_kd_arms_by_seed():
    """affine@decay < sink reads the decay arm's affine and the kd arm's sink, paired by seed; the
    teacher-level p is the sign-flip test over the teachers' mean differences, recomputed here by
    enumerating every sign assignment."""
    weights = {s: (0.01 + 0.001 * (s % 3), 0.02 - 0.0005 * (s % 5)) for s in range(1, 13)}
    teachers = {s: f'teacher_softmax_s{(s - 1) % 6}' for s in weights}
    records = [fake_run(DECAY, AFFINE, s, teachers[s], a, 2.0) for s, (a, _) in weights.items()]
    records += [fake_run('kd', SINK, s, teachers[s], b, 2.0) for s, (_, b) in weights.items()]
    records += [fake_run('kd', AFFINE, s, teachers[s], 1.0, 2.0) for s in weights]  # not read
    claim = ('decay_fig4', 'primary', 'x', 'weight', AFFINE_DECAY, '<', SINK)
    [row] = study_results.test_family(records, 'kd', 'primary', [claim], teacher_level=True)
    differences = {s: a - b for s, (a, b) in weights.items()}
    assert row['n'] == [12, 12] and math.isclose(row['difference'],
                                                 sum(differences.values()) / 12)
    assert row['p'] == 2 / 2 ** 12  # every difference negative: the most extreme of 4096
    means = {}
    for s, d in differences.items():
        means.setdefault(teachers[s], []).append(d)
    means = [sum(d) / len(d) for d in means.values()]
    extreme = sum(abs(sum(sign * m for sign, m in zip(signs, means))) >= abs(sum(means)) - 1e-12
                  for signs in itertools.product((1, -1), repeat=len(means)))
    assert row['p_teacher'] == extreme / 2 ** len(means) == 2 / 64


def test_v4s_claims_keep_every_v3_claim_and_reach_holms_floor():
    """Every v3 claim is a v4 claim in the same family; the primary family adds affine against the
    head-wise gate (two-sided) on four measures, the held-out loss on 16x the tokens and Figure 4
    in the decay arm; 12 pairs reach Holm's strictest level over the primary family (two-sided:
    2 / 2^n < 0.05 / m), and 6 teachers let the teacher-level test go below 0.05."""
    v3 = {c[3:]: c[1] for c in study_results.CLAIMS_V3}
    v4 = {c[3:]: c[1] for c in study_results.CLAIMS_V4}
    assert all(v4.get(test) == family for test, family in v3.items())
    primary = [c for c in study_results.CLAIMS_V4 if c[1] == 'primary']
    assert {(m, AFFINE, '!=', HEADWISE) for m in ('loss', 'heldout', 'share_sink',
                                                    'ratio_w8a4')} <= {c[3:] for c in primary}
    assert ('weight', AFFINE_DECAY, '<', SINK) in {c[3:] for c in primary}
    assert ('heldout', AFFINE, '<', SOFTMAX) in {c[3:] for c in primary}
    plan = sink_study.PLANS['v4']
    n, m = len(plan['kd_seeds']), len(primary)
    assert 2 / 2 ** n < 0.05 / m and 2 / 2 ** len(plan['teachers']) < 0.05
    assert len(plan['kd_seeds']) % len(plan['teachers']) == 0
    with open(os.path.join(ROOT, 'docs', 'analysis.md')) as f:
        assert f"v4: n = {n} pairs, m = {m} primary claims" in f.read()


def test_heldout_loss_is_the_mean_token_loss_over_the_windows(data_dir):
    """end.heldout against a loss computed here: one forward of all windows at once, the
    per-token cross-entropy summed in float64."""
    import torch
    import torch.nn.functional as F
    from lmkit.data import Windows
    from model import GPT, ModelConfig
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_kv_head=1, n_embd=16, intermediate_size=32,
                            vocab_size=320, block_size=32)).eval()
    windows = Windows(data_dir, 'val', 32, 0)
    count = min(10, len(windows))
    got = sink_study.heldout_loss(model, windows, count, batch_size=3)
    x, y = (torch.from_numpy(a) for a in windows.get(range(count)))
    with torch.no_grad():
        logits = model(x)[0].double()
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction='sum').item()
    assert got['windows'] == count and got['tokens'] == count * 32
    assert math.isclose(got['loss'], expected / (count * 32), rel_tol=1e-6)


def test_a_resumed_run_keeps_its_first_start(tmp_path, monkeypatch):
    """launch writes first_started once: a second launch of the same run keeps it and moves
    started; a start file of an earlier version (started alone) gives its started as the first."""
    times = iter(['2026-01-01T00:00:00+00:00', '2026-01-02T00:00:00+00:00'])
    monkeypatch.setattr(sink_study, 'now', lambda: next(times))
    monkeypatch.setattr(sink_study.children, 'start', lambda *a, **k: types.SimpleNamespace())
    run = dict(name='kd_affine_s1', argv=[], extra=[], note='')
    for _ in range(2):
        sink_study.launch(run, str(tmp_path), {})[2].close()
    with open(tmp_path / 'kd_affine_s1.start.json') as f:
        start = json.load(f)
    assert (start['first_started'], start['started']) == ('2026-01-01T00:00:00+00:00',
                                                          '2026-01-02T00:00:00+00:00')
    old = tmp_path / 'old.start.json'
    old.write_text(json.dumps(dict(started='2025-12-31T00:00:00+00:00')))
    assert sink_study.first_start(str(old)) == '2025-12-31T00:00:00+00:00'


def test_the_generic_claims_compare_every_variant_with_the_first_two_sided():
    claims = study_results.generic_claims([SOFTMAX, AFFINE, 'mine'])
    tests = {c[3:]: c[1] for c in claims}
    for m in study_results.GENERIC_MEASURES:
        assert tests[(m, AFFINE, '!=', SOFTMAX)] == tests[(m, 'mine', '!=', SOFTMAX)] == 'primary'
        assert tests[(m, AFFINE, '!=', 'mine')] == 'secondary'
    assert len(claims) == 3 * len(study_results.GENERIC_MEASURES)
    without_softmax = study_results.generic_claims([AFFINE, 'mine'])
    assert 'share_sink' not in {c[3] for c in without_softmax}  # its layers are softmax's


# -----------------------------------------------------------------------------------------------
# A variant a user brings: registered in a copy of the repository, studied without editing study/

MY_ATTENTION = '''

def halved_forward(attn, q, k, v, causal, mask, **call):  # softmax at half the scores
    return softmax_attention(q * 0.5, k, v, causal, mask)


def halved_weights(attn, scores, **call):
    return torch.softmax(scores * 0.5, dim=-1)


'''


def repository_copy(tmp_path):
    """The tracked files outside docs/ and tests/, copied; model.py gains the `halved` variant."""
    files = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    copy = tmp_path / 'repo'
    for name in files:
        if not name.startswith(('docs/', 'tests/')):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(ROOT, name), copy / name)
    source = (copy / 'model.py').read_text()
    source = source.replace('\n\n@dataclass(frozen=True)\nclass Variant:',
                            MY_ATTENTION + '@dataclass(frozen=True)\nclass Variant:', 1)
    entry = "    'halved': Variant(halved_forward, halved_weights),\n"
    source = source.replace('\nVARIANTS = {\n', '\nVARIANTS = {\n' + entry, 1)
    assert source.count("'halved': Variant(halved_forward") == 1
    (copy / 'model.py').write_text(source)
    return copy


@pytest.mark.xdist_group('custom_study')
def test_a_custom_plan_studies_a_variant_defined_here_end_to_end(study_data, tmp_path):
    """python -m study.sink_study --plan=custom --variants=softmax,halved in a copy whose model.py
    registers `halved` (the study's files untouched): the teacher and 3 pairs train, each record
    names its variant, and the report tests the generic claims between the two, each with a
    verdict and a teacher-level p."""
    copy = repository_copy(tmp_path)
    out = tmp_path / 'custom'
    command = [sys.executable, '-m', 'study.sink_study', '--plan=custom',
               '--variants=softmax,halved', '--kd_seeds=1,2,3', '--teachers=11',
               f'--out_dir={out}', f'--data_dir={study_data}', '--tokens=2048', '--block_size=32',
               '--compile=False', '--eval_batches=2', '--jobs=1']
    done = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = sorted(os.listdir(out / 'runs'))
    assert names == ['kd_halved_s1.json', 'kd_halved_s2.json', 'kd_halved_s3.json',
                     'kd_softmax_s1.json', 'kd_softmax_s2.json', 'kd_softmax_s3.json',
                     'teacher_softmax_s11.json']
    with open(out / 'results.json') as f:
        results = json.load(f)
    assert results['claim_set'] == 'custom' and results['variants'] == [SOFTMAX, 'halved']
    rows = {r['id']: r for r in results['claims'] if r['family'] == 'primary'}
    assert sorted(rows) == sorted(f'{m}_halved_softmax' for m in study_results.GENERIC_MEASURES)
    sink_layers, _ = study_results.sink_layers(results['runs'], 'kd')
    for cid, row in rows.items():
        if cid.startswith('share_sink') and not sink_layers:  # no layer where softmax has a sink
            assert row['verdict'] == 'not measured'
            continue
        assert row['n'] == [3, 3] and row['p_teacher'] is None  # one teacher
        assert row['verdict'].startswith(('no detectable difference', 'halved lower',
                                          'softmax lower'))
    with open(out / 'report.md') as f:
        report = f.read()
    assert 'halved against softmax (no claim of the paper)' in report
