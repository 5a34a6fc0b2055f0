"""The sink study (study/sink_study.py) and what it rests on: windows that start with a fixed token,
the standard-library corpus, the study's measurements against an independent recomputation, its
verdicts, and the README's numbers."""
import json
import math
import os

import numpy as np
import pytest

import prepare_data
from lmkit.data import Windows, first_token_id, prefix_id, read_meta
from prepare_data import read_shard
from lmkit.errors import RunError
from study.study_records import NO_DECAY


def test_prefix_windows_start_with_the_token_and_cover_every_token_once(data_dir):
    """first_token='prefix': every window is [token] + block_size - 1 stream tokens, and its targets
    are the next block_size stream tokens; windows do not overlap, so each stream token is a target
    exactly once."""
    T = 64
    token = prefix_id(read_meta(data_dir)['tokenizer'])
    assert token == 256  # the bytes tokenizer has no BOS: its <|endoftext|>
    windows = Windows(data_dir, 'train', T, token)
    stream = np.asarray(read_shard(os.path.join(data_dir, 'train_000000.bin')))
    assert len(windows) == len(stream) // T
    x, y = windows.get(range(len(windows)))
    assert (x[:, 0] == token).all() and x.shape == y.shape == (len(windows), T)
    assert (x[:, 1:] == y[:, :-1]).all()
    assert (y.reshape(-1) == stream[:len(windows) * T]).all()  # every target once, in stream order
    # the default windows are what they were: block_size + 1 tokens from k * block_size
    x, y = Windows(data_dir, 'train', T).get([3])
    assert (x[0] == stream[3 * T:4 * T]).all() and y[0, -1] == stream[4 * T]
    assert first_token_id('stream', read_meta(data_dir)['tokenizer']) is None
    assert first_token_id('prefix', read_meta(data_dir)['tokenizer']) == 256


def test_prefix_needs_a_token():
    with pytest.raises(RunError, match="neither a BOS nor an end-of-text token"):
        prefix_id(dict(spec='tok', bos_id=None, eos_id=None))


def test_stdlib_corpus_is_recorded(tmp_path):
    """--source=stdlib: the standard library's .py files, their count, size and sha256 in
    meta.json."""
    documents, described = prepare_data.stdlib_corpus()
    assert described['files'] == len(documents) > 500 and described['bytes'] > 5_000_000
    out = tmp_path / 'stdlib'
    prepare_data.main(['--source=stdlib', '--tokenizer=bytes', f'--out_dir={out}', '--val_every=50',
                       '--num_proc=1', '--max_tokens=20000'])
    source = read_meta(out)['settings']['source']
    assert source['corpus'] == described and source['python']
    first = read_shard(str(out / 'train_000000.bin'))[:200]
    # document 0 is held out (0 mod 50)
    assert bytes(first.astype(np.uint8)) == documents[1].encode()[:200]


def test_the_study_end_to_end(study_data, tmp_path):
    """study/sink_study.py on a few thousand tokens (softmax and affine: a CE run, a KD run and a
    control run): a record per run, results.json (schema 2, the v1 fields kept), report.md and the
    figures; each run's first-token weights agree with a recomputation from its checkpoint through
    another path: transformers' eager attentions of the exported softmax model, the float64
    references of test_model.py (written from the paper's equations) for the others; the control
    run's alpha_proj did not decay; a record of another recipe is left out; and a re-run trains
    nothing."""
    import torch
    from transformers import AutoModelForCausalLM
    import export_hf
    from study import sink_study
    from study import study_records
    from lmkit import probes
    from lmkit.checkpoint import read_checkpoint
    from model import GPT
    from test_analyze import explicit_weights
    from test_probes import gu_metric
    out = tmp_path / 'study'
    argv = [f'--out_dir={out}', f'--data_dir={study_data}', '--variants=softmax,affine',
            '--seeds=1', '--kd_seeds=1',
            '--teachers=1', '--arms=ce,kd,control', '--control_seeds=1', '--tokens=4096',
            '--block_size=32', '--compile=False', '--eval_batches=2']
    results = sink_study.main(argv)
    assert json.loads((out / 'results.json').read_text()) == json.loads(json.dumps(results))
    assert results['schema_version'] == 2 and results['bos_id'] == 256 and results['context'] == 32
    assert results['corpus']['source'] == 'builtin' and results['teachers'] == ['ce_softmax_s1']
    assert results['uniform_first_token'] == pytest.approx(sum(1 / (i + 1)
                                                               for i in range(1, 32)) / 31)
    assert [(r['arm'], r['variant']) for r in results['runs']] == [
        ('ce', 'softmax'), ('ce', 'affine'), ('kd', 'softmax'), ('kd', 'affine'),
                                                                   ('control', 'affine')]
    for name in ('report.md', 'fig4_ce.png', 'fig4_kd.png', 'curves_ce.png', 'curves_kd.png'):
        assert (out / name).is_file()
    report = (out / 'report.md').read_text()
    assert report.index('## KD arm') < report.index('## CE arm') and 'fig4_affine_sink' in report
    # one seed each
    assert all(c['verdict'].startswith(('numbers only', 'not measured')) for c in results['claims'])
    # the study's fixed windows (attention_windows)
    windows = Windows(study_data, 'val', 32, 256).get(range(8))[0]
    idx = torch.from_numpy(windows)
    for run in results['runs']:
        assert set(V1_FIELDS) <= set(run) and {'tokens', 'first_token_weight',
                                               'val_loss'} <= set(run['curve'][0])
        assert run == sink_study.summary(
            json.loads((out / 'runs' / f"{run['name']}.json").read_text()))
        assert (run['tokens'] == 4096 and len(run['curve']) >= 2
                and run['curve'][-1]['tokens'] == 4096)
        assert (run['final_kd_loss'] is None) == (run['arm'] == 'ce')
        assert run['teacher'] == (None if run['arm'] == 'ce' else 'ce_softmax_s1')
        model = GPT.from_pretrained(run['ckpt']).eval()
        if run['variant'] == 'softmax' and run['arm'] == 'ce':  # through transformers
            ckpt = read_checkpoint(run['ckpt'])
            export_hf.export(model, ckpt['tokenizer'], str(tmp_path / 'hf'), check=False)
            hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / 'hf'),
                                                      attn_implementation='eager').double()
            attentions = hf(idx, output_attentions=True).attentions
        else:
            attentions = explicit_weights(model.double(), idx)
        recomputed = [a[:, :, 1:, 0].mean().item() for a in attentions]
        assert run['first_token_weight'] == pytest.approx(recomputed, abs=2e-6)
        # Gu et al.'s Sink_1 on these windows (its reference: tests/test_probes.py)
        w = torch.stack(attentions, 1)
        rows = (w if probes.weight_rows(model.config)[0]
                else w.abs() / (w.abs().sum(-1, keepdim=True) + 1e-8))
        assert run['sink_rate'] == pytest.approx(gu_metric(rows)[:, 0].mean().item(), abs=1e-7)
    # the control: weight decay off on alpha_proj and g_proj only; 4096 tokens are 8 steps, all in
    # warmup (lr > 0)
    control = GPT.from_pretrained(str(out / 'train' / 'control_affine_s1'))
    config = json.loads((out / 'train' / 'control_affine_s1' / 'config.json').read_text())
    assert (config['no_decay'] == ['alpha_proj', 'g_proj']
            and results['runs'][-1]['no_decay'] == config['no_decay'])
    assert control.model.layers[0].self_attn.alpha_proj.weight.requires_grad
    # every reader of these checkpoints puts the token first, as their training windows had it
    import analyze
    from lmkit import loading
    from lmkit import zeroshot
    ce = str(out / 'train' / 'ce_affine_s1')
    assert loading.window_first_token(ce) == 256
    analyze.main(['attention', ce, f'--out_dir={tmp_path / "attention"}', f'--data={study_data}',
                  '--num_seqs=2', '--seq_len=32', '--sink_samples=4'])
    numbers = json.loads((tmp_path / 'attention' / 'numbers.json').read_text())
    assert [m['first_token'] for m in numbers['models'].values()] == [256]
    model = GPT.from_pretrained(ce).eval()
    ids = list(range(97, 97 + 64))
    with_token = zeroshot.c4_perplexity(model, ids, 2, 32, 2, first_token=256)
    by_hand = torch.tensor([[256] + ids[:31], [256] + ids[31:62]])
    logits, _ = model(by_hand)
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                            by_hand[:, 1:].reshape(-1))
    assert with_token['nll'] == pytest.approx(nll.item(), rel=1e-5)
    # a record of another recipe is never mixed in; a re-run trains nothing and rewrites no record
    other = dict(json.loads((out / 'runs' / 'ce_affine_s1.json').read_text()), name='ce_affine_s9',
                 seed=9)
    other['recipe'] = dict(other['recipe'], learning_rate=1.0)
    other['digest'] = study_records.digest(other)  # a valid record, of another recipe and seed
    (out / 'runs' / 'ce_affine_s9.json').write_text(json.dumps(other))
    stamps = {p: p.stat().st_mtime_ns
              for p in [*(out / 'runs').iterdir(), out / 'train' / 'ce_softmax_s1' / 'ckpt.pt']}
    # never in silence
    with pytest.raises(RunError, match=r"ce_affine_s9 \(not planned by this command\)"):
        sink_study.main(argv)
    again = sink_study.main(argv + ['--subset=True'])
    assert (again['excluded'] == ['ce_affine_s9'] and len(again['runs']) == 5
            and 'ce_affine_s9' in (out / 'report.md').read_text())
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}


V1_FIELDS = ('variant', 'seed', 'arm', 'tokens', 'seconds', 'val_loss', 'first_token_weight',
             'first_token_share',
             'sink_mass', 'per_head', 'sink_rate', 'entropy', 'row_sum', 'spikes', 'curve', 'ckpt')


def test_progress_reads_the_last_step_past_long_lines(tmp_path):
    """The console's step counts: a metrics.jsonl whose last line (an evaluation of every head) is
    longer than any fixed tail still gives its step, a line cut mid-write gives the one before, a
    NaN loss is reported."""
    from study.sink_study import last_logged
    path = tmp_path / 'metrics.jsonl'
    assert last_logged(str(tmp_path)) == (0, True)
    rows = [dict(step=1, loss=2.0), dict(step=2, loss=float('nan')),
            dict(step=3, loss=1.5, heads=[0.25] * 20_000)]
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    assert path.stat().st_size > 100_000
    assert last_logged(str(tmp_path)) == (3, True)
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows[:2]) + json.dumps(rows[2])[:50_000])
    assert last_logged(str(tmp_path)) == (2, False)


def test_no_decay_leaves_those_matrices_out_of_weight_decay():
    """train.configure_optimizers: the named modules' matrices join the vectors in the group without
    decay; the default groups are what they were (old checkpoints' optimizer states still line
    up)."""
    import train
    from test_analyze import tiny_model
    model = tiny_model('affine_gated')
    names = {id(p): n for n, p in model.named_parameters()}
    default = train.configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), fused=False)
    control = train.configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), fused=False,
                                         no_decay=['alpha_proj', 'g_proj'])
    decayed = lambda opt: {names[id(p)] for p in opt.param_groups[0]['params']}
    assert decayed(default) == {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert decayed(default) - decayed(control) == {n for n in decayed(default)
                                                   if '.alpha_proj.' in n or '.g_proj.' in n}
    assert any('.alpha_proj.' in n
               for n in decayed(default)) and control.param_groups[1]['weight_decay'] == 0.0


def test_claims_get_their_words_from_the_tests():
    """study_results.test_claims on made-up records of 6 ce seeds per variant: affine's weight below
    sink's in every seed is supported (exact p = 2 / 924, Holm over the 7 primary claims), sink's
    above softmax's contradicted, equal losses not decided; the recipe's seed 0 never enters; 2 kd
    seeds give numbers only; kd permutes within teachers."""
    from study import study_results

    def record(arm, variant, seed, weight, teacher=None):
        jitter = 1e-3 * seed
        return dict(arm=arm, variant=variant, seed=seed, teacher=teacher,
                    first_token_weight=[weight + jitter] * 4,
                    first_token_share=[0.1] * 4, first_or_null=[0.1] * 4,
                    entropy=[2.0 + jitter] * 4,
                    val_loss=1.7, final_kd_loss=0.5, spikes={'6': 0, '9': 0},
                    end=dict(row_total_std=[0.1] * 4,
                             gu=dict(sink_rate=0.1 if variant == 'softmax' else 0.0),
                             w8a8=dict(ratio=1.0), knockout=dict(ratio_first_0=1.0)))
    weights = dict(affine=0.01, sink=0.5, softmax=0.1, gated=0.05)
    # seed 0: never tested
    records = [record('ce', v, s, w) for v, w in weights.items() for s in range(0, 7)]
    records += [record('ce', 'affine', 0, 9.0)]  # would turn the verdict if seed 0 counted
    records += [record('kd', v, s, w, teacher=f'ce_softmax_s{1 + s % 2}') for v,
                w in weights.items() for s in (1, 2)]
    claims = {(c['arm'], c['id']): c for c in study_results.test_claims(records)}
    first = claims['ce', 'fig4_affine_sink']
    assert first['n'] == [6, 6] and first['p'] == pytest.approx(2 / 924)
    assert first['p_holm'] == pytest.approx(7 * 2 / 924)
    assert first['verdict'] == f"supported (p = {7 * 2 / 924:.3g})"
    assert claims['ce', 'fig4_sink_softmax']['verdict'].startswith('contradicted')
    assert (claims['ce', 'fig7_affine_softmax']['verdict'] == 'not decided (p = 1; no difference '
                                                              'was observed)')
    # 0 of 6 against 6 of 6: 2 / C(12, 6)
    assert claims['ce', 'gu_sink']['test'] == "Fisher's exact"
    assert claims['ce', 'gu_sink']['p'] == pytest.approx(1 / 462)
    assert all(c['verdict'].startswith('numbers '
                                       'only') for (arm, _), c in claims.items() if arm == 'kd')
    assert claims['kd', 'fig4_affine_sink']['test'] == 'exact permutation within teachers'

    # the control (3 seeds against kd's 2): its words, and affine without decay beside the kd sink
    # as numbers only
    records += [record('control', v, s, 0.002, teacher=f'ce_softmax_s{1 + s % 2}')
                for v in ('affine', 'gated') for s in (1, 2, 3)]
    tested = study_results.test_claims(records)
    words = ' '.join(study_results.control_sentences(dict(runs=records, claims=tested)))
    assert ("affine's weight numbers only (fewer than 3 seeds in a group; 0.004 without, "
            "0.0115 with)" in words)
    # every measure of Figure 4's comparison (first_or_null 0.1 on both sides here), never the
    # weight alone
    assert ("affine (3 seeds) against the kd sink (2 seeds; the recipe never decays sink's logits) "
            "had first-token weight 0.0040 ± 0.0010 against 0.5015 ± 0.0007, first-token share "
            "0.1000 ± 0.0000 against 0.1000 ± 0.0000, first-token-or-null 0.1000 ± 0.0000 against "
            "0.1000 ± 0.0000: numbers only") in words


def test_the_design_confounds_come_from_the_records():
    """study_results.confounds on made-up kd records: each of v1's four confounds is said,
    with the records' numbers, where the records show it, and none where a design removed them
    (v2's: the variants' own matrices out of the decay, a sink in half of the layers or more, larger
    teachers of other seeds, no "Sink_1 > 0" claim)."""
    from study import study_results

    def run(variant, seed, rates, no_decay=()):
        return dict(name=f'kd_{variant}_s{seed}', arm='kd', variant=variant, seed=seed,
                    no_decay=list(no_decay),
                    first_token_weight=[0.3, 0.1, 0.02, 0.02],
                    end=dict(gu=dict(samples=100, sink_rate=sum(rates) / 4,
                                     sink_rate_per_layer=rates)))
    recipe = dict(weight_decay=2.0, n_layer=4, n_head=4)
    teacher = dict(name='ce_softmax_s1', arm='ce', variant='softmax', seed=1, recipe=recipe)
    v1 = dict(recipe=recipe, layers=4, teachers=['ce_softmax_s1'], uniform_first_token=0.035,
              claims=[dict(measure='sink_grown')],
              runs=[teacher, run('softmax', 1, [0.5, 0.0, 0.0, 0.0]),
                    run('softmax', 2, [0.7, 0.0, 0.0, 0.0]),
                    run('affine', 1, [0.0, 0.0, 0.0, 0.0])])
    lead, found = study_results.confounds(v1)
    words = ' '.join([lead] + [f"({i}) {x}" for i, x in enumerate(found, 1)])
    assert words.startswith("This design has 4 confounds its records show")
    assert ("(1) the recipe's weight decay (2; the paper's: 0.1) acts on affine's alpha_proj"
            in words)
    assert ("(2) the sink lives in 1 of 4 layers: kd softmax's first-token weight per layer is "
            "0.300, 0.100, 0.020, 0.020 (uniform attention: 0.035) and Gu et al.'s Sink₁ per layer "
            "0.60, 0.00, 0.00, 0.00") in words
    assert "(3) the teachers are ce_softmax_s1, of the students' own shape and tokens" in words
    assert "kd seeds 1 are their own seeds" in words
    assert "one of 1,600 (sample, layer, head) triples" in words
    assert "0.125 to 0.175 (softmax), 0 to 0 (affine)" in words
    larger = dict(teacher, name='teacher_softmax_s101', seed=101, recipe=dict(recipe, n_layer=8))
    v2 = dict(v1, teachers=['teacher_softmax_s101'], claims=[dict(measure='weight')],
              runs=[larger, run('softmax', 1, [0.5, 0.3, 0.0, 0.0], NO_DECAY),
                    run('affine', 1, [0.0, 0.0, 0.0, 0.0], NO_DECAY)])
    assert study_results.confounds(v2)[1] == []


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def block(path, start, end):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    assert text.count(start) == text.count(end) == 1, f"{path}: the markers {start!r}, {end!r}"
    return text.split(start)[1].split(end)[0].strip('\n')


@pytest.mark.parametrize('study, plan', [('sink_study_v4', 'v4'), ('sink_study_v3', 'v3'),
                                         ('sink_study_v2', 'v2'), ('sink_study', 'full')])
def test_each_report_is_its_committed_results(study, plan):
    """Each committed study's report is its results.json's (study_results.report_lines), the
    figures it shows are committed beside it, and its records' seeds and teachers are its plan's.
    The README's findings, where every study is a column, and each report's opening are
    tests/test_findings.py's."""
    from study import sink_study
    from study import study_results
    with open(os.path.join(ROOT, 'docs', study, 'results.json')) as f:
        results = json.load(f)
    for name in ('report.md', 'fig4_kd.png', 'curves_kd.png', 'rows_kd.png', 'claims_kd.png'):
        assert os.path.getsize(os.path.join(ROOT, 'docs', study, name)) > 1000, name
    with open(os.path.join(ROOT, 'docs', study, 'report.md')) as f:
        # the report is the records' too
        assert f.read() == '\n'.join(study_results.report_lines(results)) + '\n'
    assert results['schema_version'] == sink_study.SCHEMA_VERSION
    args, _ = sink_study.parse_args([f'--plan={plan}'])
    seeds = {r['seed'] for r in results['runs'] if r['arm'] == 'kd'}
    assert seeds == set(args.kd_seeds) and results['teachers'] == [
        sink_study.teacher_of(s, args) for s in range(1, len(args.teachers) + 1)]


def test_analysis_md_shows_the_claims_and_the_pilot():
    """docs/analysis.md's claims table is study_results.CLAIMS, and its pilot table the committed
    pilot's results."""
    from study import study_results
    got = block('docs/analysis.md', '<!-- the claims: study_results.claims_table() '
                                    '-->', '<!-- end of the claims -->')
    assert got == '\n'.join(study_results.claims_table())
    with open(os.path.join(ROOT, 'docs', 'sink_study', 'pilot', 'results.json')) as f:
        pilot = json.load(f)
    got = block('docs/analysis.md', '<!-- the pilot: '
                                    'study_results.pilot_lines(docs/sink_study/pilot/results.json) '
                                    '-->',
                '<!-- end of the pilot -->')
    assert got == '\n'.join(study_results.pilot_lines(pilot))
    assert sorted(r['name'] for r in pilot['runs']) == sorted(
        f'{arm}_{v}_s{s}' for arm in ('ce', 'kd') for v in ('softmax', 'sink', 'gated', 'affine')
                                                              for s in (1, 2, 3))
    # the quick start's "about an hour on 2 cores" for `python -m study.sink_study` (the pilot) is
    # the committed pilot's time: its runs' steps and end-of-run measures, two at a time (measured:
    # 60.5 minutes from first start to last end)
    with open(os.path.join(ROOT, 'README.md')) as f:
        assert ('python -m study.sink_study     # the sink study\'s pilot '
                '(about an hour on 2 cores)' in f.read())
    # two at a time: the default jobs, one per core, on the 2-core machine that trained all 24
    assert ('--jobs' not in pilot['command']
            and pilot['machine'].endswith('2 CPU cores, device cpu (24 runs)'))
    assert 45 <= sum(r['seconds'] + r['end_seconds'] for r in pilot['runs']) / 2 / 60 <= 80


# -----------------------------------------------------------------------------
# Every verdict of the committed study, recomputed from its records by a second implementation

def committed(study='sink_study'):
    root = os.path.join(ROOT, 'docs', study)
    with open(os.path.join(root, 'results.json')) as f:
        results = json.load(f)
    records = []
    for name in sorted(os.listdir(os.path.join(root, 'runs'))):
        with open(os.path.join(root, 'runs', name)) as f:
            records.append(json.load(f))
    return results, records


def value(record, measure, sink_layers=()):
    """Each claim's measure read from a record, written here from docs/analysis.md's definitions
    (sink_layers: softmax's, 1-based, for share_sink)."""
    mean = lambda xs: sum(xs) / len(xs)
    if measure == 'loss':
        return record['val_loss'] if record['arm'] == 'ce' else record['final_kd_loss']
    if measure == 'share_sink':
        return mean([record['first_token_share'][k - 1] for k in sink_layers]) if sink_layers \
            else None
    end = record['end']
    payoff = end.get('payoff', {})
    weights = record['first_token_weight']
    return dict(weight=lambda: mean(weights), share=lambda: mean(record['first_token_share']),
                first_or_null=lambda: mean(record['first_or_null']),
                entropy=lambda: mean(record['entropy']),
                entropy_deep=lambda: mean(record['entropy'][len(record['entropy']) // 2:]),
                spikes9=lambda: record['spikes']['9'],
                row_spread=lambda: mean(end['row_total_std']),
                sink_grown=lambda: float(end['gu']['sink_rate'] > 0),
                w8a8=lambda: end['w8a8']['w8a8'] / end['w8a8']['fp'],
                knockout0=lambda: end['knockout']['first_0'] / end['knockout']['full'],
                # v2's secondary readings
                weight_deep=lambda: mean(weights[len(weights) // 2:]),
                **{f'weight_l{k}': lambda k=k: weights[k - 1] for k in range(1, len(weights) + 1)},
                gu_rate=lambda: end['gu']['sink_rate'],
                gu_rate_raw=lambda: end['gu']['sink_rate_raw'],
                sink_grown16=lambda: float(end['gu']['sink_rate'] >= 1 / 16),
                spikes9_after=lambda: (record['spikes_after_warmup'] or {}).get('9'),
                # v3's
                val_loss=lambda: record['val_loss'],
                heldout=lambda: end['heldout']['loss'],  # v4's
                **{f'ratio_{q}': lambda q=q: payoff[q] / end['w8a8']['fp']
                   for q in ('w8a6', 'w4a8', 'w8a4')},
                ffn_kurtosis=lambda: max(payoff['ffn_kurtosis']),
                ffn_max_abs=lambda: max(payoff['ffn_max_abs']))[measure]()


def every_labelling(a, b, strata_a, strata_b):
    """Exact two-sided permutation p by brute force: all 2^n labellings of the seeds as a matrix,
    kept where every stratum has its observed group sizes."""
    values, strata = np.array(a + b, dtype=np.float64), strata_a + strata_b
    # (2^n, n), 1: group a
    labels = (np.arange(2 ** len(values))[:, None] >> np.arange(len(values))) & 1
    for s in set(strata):
        in_s = np.array([t == s for t in strata])
        labels = labels[labels[:, in_s].sum(1) == sum(t == s for t in strata_a)]
    differences = labels @ values / len(a) - (1 - labels) @ values / len(b)
    observed = abs(np.mean(a) - np.mean(b))
    return float(np.mean(np.abs(differences) >= observed - 1e-9))


def counted_fisher(hits_a, n_a, hits_b, n_b):
    """Fisher's two-sided p by counting every choice of which seeds form group a."""
    import itertools
    seeds = [1] * (hits_a + hits_b) + [0] * (n_a + n_b - hits_a - hits_b)
    tables = {}
    for pick in itertools.combinations(range(len(seeds)), n_a):
        x = sum(seeds[i] for i in pick)
        tables[x] = tables.get(x, 0) + 1
    return sum(c for c in tables.values() if c <= tables[hits_a]) / sum(tables.values())


def test_every_verdict_recomputed_from_the_committed_records():
    """Each claim of docs/sink_study/results.json from the records under docs/sink_study/runs: its
    groups (the recipe's seed 0 left out, records of another recipe too), its values, its p by
    another implementation, Holm's adjustment by the step-down definition, and its verdict word."""
    results, records = committed()
    kept = [r for r in records if r['recipe'] == results['recipe']]
    # results.json holds the records, less per-head lists and curves
    runs = {r['name']: r for r in results['runs']}
    assert sorted(runs) == sorted(r['name'] for r in kept)
    for record in kept:
        run = runs[record['name']]
        assert {k: v for k, v in run.items() if k != 'curve'} == {
            k: v for k, v in record.items() if k in run and k != 'curve'} and 'per_head' in run
        assert [{k: p[k] for k in point} for point,
                p in zip(run['curve'], record['curve'])] == run['curve']
    claims = [c for c in results['claims'] if c['family'] != 'control']
    assert {c['arm'] for c in claims} == {'kd', 'ce'} and len(claims) == 44
    for claim in claims:
        group = lambda v: [r for r in kept if r['arm'] == claim['arm'] and r['variant'] == v
                           and r['seed'] != 0]
        a, b = group(claim['low']), group(claim['high'])
        assert claim['n'] == [len(a), len(b)]
        if not a or not b:
            assert claim['verdict'] == 'not measured'
            continue
        va, vb = [value(r, claim['measure']) for r in a], [value(r, claim['measure']) for r in b]
        assert claim['mean'] == pytest.approx([np.mean(va), np.mean(vb)], abs=1e-12)
        if claim['measure'] == 'sink_grown':
            p = counted_fisher(int(sum(va)), len(va), int(sum(vb)), len(vb))
        else:
            strata = ((lambda runs: [r['teacher'] for r in runs]) if claim['arm'] == 'kd'
                      else (lambda runs: [0] * len(runs)))
            p = every_labelling(va, vb, strata(a), strata(b))
        assert claim['p'] == pytest.approx(p, abs=1e-9), claim['id']
    for arm in ('kd', 'ce'):
        for family in ('primary', 'secondary'):
            check_holm_and_verdicts([c for c in claims if c['arm'] == arm
                                     and c['family'] == family])


def check_holm_and_verdicts(family, holm_over=None):
    """One family's claims: Holm's adjustment by the step-down definition over those with 3 seeds a
    side (of holm_over, where more comparisons than these share the family), and each verdict word
    from its adjusted p and the sign of its difference."""
    ranked = sorted([c for c in holm_over or family if min(c['n']) >= 3], key=lambda c: c['p'])
    # Holm: max over the ranks up to this one of (m - rank) p, at most 1
    for i, c in enumerate(ranked):
        assert c['p_holm'] == pytest.approx(min(1,
                                                max((len(ranked) - j) * ranked[j]['p']
                                                    for j in range(i + 1))))
    for c in family:
        if min(c['n']) < 3:
            assert c['verdict'].startswith(('numbers only', 'not measured')) and 'p_holm' not in c
        elif c['p_holm'] >= 0.05:
            assert c['verdict'].startswith((f"not decided (p = {c['p_holm']:.3g}",
                                            f"no detectable difference (p = {c['p_holm']:.3g})"))
        elif c['direction'] == '!=':  # two-sided: which side is lower
            lower = c['low'] if c['mean'][0] < c['mean'][1] else c['high']
            assert c['verdict'] == f"{lower} lower (p = {c['p_holm']:.3g})"
        else:
            agrees = (c['mean'][0] < c['mean'][1]) == (c['direction'] == '<')
            assert (c['verdict'] == f"{'supported' if agrees else 'contradicted'} (p = "
                                    f"{c['p_holm']:.3g})")


def every_sign_flip(differences):
    """Exact two-sided p of a mean paired difference by brute force: all 2^n assignments of signs as
    a matrix."""
    d = np.array(differences, dtype=np.float64)
    signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) * (1 - 1e-9)))


def subset_sizes(k):
    """How many subsets of k seeds have each size: over every bit mask of the k seeds, or, for more
    than 12, over each half's (a subset of them all is one of each half's: the counts convolve)."""
    if k > 12:
        return np.convolve(subset_sizes(k // 2), subset_sizes(k - k // 2))
    masks = np.arange(2 ** k)
    return np.bincount(sum(((masks >> i) & 1 for i in range(k)), 0 * masks), minlength=k + 1)


def fisher_by_subsets(hits_a, n_a, hits_b, n_b):
    """Fisher's two-sided p by counting the subsets of n_a of the n_a + n_b seeds by the hits (the
    seeds with the outcome) each holds, then summing the counts no larger than the observed. A
    subset holding x hits is one of the hits' subsets of x seeds with one of the others' of n_a - x
    (subset_sizes counts each part's: 2^12 masks at most, where the 2^24 subsets of 24 seeds took
    seconds a count)."""
    n, hits = n_a + n_b, hits_a + hits_b
    with_hit, without = subset_sizes(hits), subset_sizes(n - hits)
    counts = np.array([with_hit[x] * without[n_a - x] if 0 <= n_a - x <= n - hits else 0
                       for x in range(hits + 1)])
    return float(counts[counts <= counts[hits_a] * (1 + 1e-7)].sum() / counts.sum())


@pytest.mark.parametrize('study, claim_set, n_records, n_claims',
                         [('sink_study_v4', 'v4', 78, 86), ('sink_study_v3', 'v3', 52, 56),
                          ('sink_study_v2', 'v2', 50, 34)])
def test_every_sealed_verdict_recomputed_from_the_committed_records(study, claim_set, n_records,
                                                                    n_claims):
    """Each claim of a sealed study's results.json from the records under its runs/: its matched
    pairs (seed by seed), its values, its p by brute force (every sign flip; every subset for
    Fisher's), Holm's adjustment by the step-down definition, and its verdict word. softmax's
    sink layers (share_sink): where Gu et al.'s Sink_1, mean over softmax's seeds, is >= 1/16."""
    results, records = committed(study)
    assert results['claim_set'] == claim_set and len(records) == n_records
    runs = {r['name']: r for r in results['runs']}
    assert sorted(runs) == sorted(r['name'] for r in records)
    for record in records:
        run = runs[record['name']]
        assert {k: v for k, v in run.items() if k != 'curve'} == {
            k: v for k, v in record.items() if k in run and k != 'curve'}
    claims = results['claims']
    assert {c['arm'] for c in claims} == {'kd'} and len(claims) == n_claims

    def group(name):  # a variant's kd runs, or another arm's (v4: affine@decay)
        variant, _, arm = name.partition('@')
        return {r['seed']: r for r in records
                if r['arm'] == (arm or 'kd') and r['variant'] == variant}
    softmax_rates = np.mean([r['end']['gu']['sink_rate_per_layer']
                             for r in group('softmax').values()], axis=0)
    sink_layers = [k + 1 for k, rate in enumerate(softmax_rates) if rate >= 1 / 16]
    for claim in claims:
        a, b = group(claim['low']), group(claim['high'])
        va, vb = ({s: v for s, r in side.items()
                   if (v := value(r, claim['measure'], sink_layers)) is not None}
                  for side in (a, b))
        assert claim['n'] == [len(va), len(vb)]
        if not va or not vb:
            assert claim['verdict'] == 'not measured'
            continue
        assert claim['mean'] == pytest.approx([np.mean(list(va.values())),
                                               np.mean(list(vb.values()))], abs=1e-12)
        if claim['measure'] in ('sink_grown16', 'sink_grown'):
            p = fisher_by_subsets(int(sum(va.values())), len(va), int(sum(vb.values())), len(vb))
        elif sorted(va) == sorted(vb):
            assert claim['test'] == 'exact sign-flip, paired by seed'
            p = every_sign_flip([va[s] - vb[s] for s in sorted(va)])
        else:  # a seed without the measure on one side: unpaired, within teachers
            teacher = lambda runs, seeds: [runs[s]['teacher'] for s in seeds]
            p = every_labelling(list(va.values()), list(vb.values()), teacher(a, va),
                                teacher(b, vb))
        assert claim['p'] == pytest.approx(p, abs=1e-9), claim['id']
        if claim.get('p_teacher') is not None:  # v4: the sign flips of the teachers' means
            by_teacher = {}
            for seed in va:
                by_teacher.setdefault(a[seed]['teacher'], []).append(va[seed] - vb[seed])
            assert claim['p_teacher'] == pytest.approx(
                every_sign_flip([np.mean(d) for d in by_teacher.values()]), abs=1e-9)
    for family in ('primary', 'secondary'):
        check_holm_and_verdicts([c for c in claims if c['family'] == family])


def test_matched_seeds_are_compared_in_pairs():
    """Records of matched_init runs with the same seeds on both sides are compared by seed: 12 pairs
    in which affine's weight is below sink's in every seed give the sign-flip test's floor, 2 /
    4096; unpaired, the seeds' own spread (0.01 a seed, larger than the difference) hides it (p >
    0.05). Without matched_init, or with other seeds on one side, the test is unpaired."""
    from study import study_results

    def record(variant, seed, weight, matched=True):
        return dict(arm='kd', variant=variant, seed=seed,
                    teacher=f'teacher_softmax_s{101 + seed % 2}',
                    settings=dict(matched_init=matched),
                    first_token_weight=[weight + 0.01 * seed] * 4)
    affine = [record('affine', s, 0.01) for s in range(1, 13)]
    sink = [record('sink', s, 0.02 + 0.001 * s) for s in range(1, 13)]
    paired = study_results.compare(affine, sink, 'weight', '<', 7)
    assert (paired['test'] == 'exact sign-flip, paired by seed'
            and paired['p'] == pytest.approx(2 / 4096))
    assert paired['n'] == [12, 12] and paired['difference'] == pytest.approx(-(0.01 + 0.0065))
    unmatched = [dict(r, settings=dict(matched_init=False)) for r in sink]
    assert study_results.compare(affine, unmatched, 'weight', '<',
                                 7)['test'].startswith('exact permutation')
    assert study_results.compare(affine, unmatched, 'weight', '<', 7)['p'] > 0.05
    other_seeds = [dict(r, seed=r['seed'] + 12) for r in sink]
    assert study_results.compare(affine, other_seeds, 'weight', '<',
                                 7)['test'].startswith('exact permutation')


def test_v2_claims_on_matched_pairs():
    """study_results.test_claims(records, 'v2') on made-up kd records of 12 matched seeds per core
    variant: the 7 primary claims (v1's) and 27 secondary ones, each primary one paired by seed.
    Affine's weight is below sink's in every seed, so p = 2 / 4096 (sign flips), Holm-adjusted over
    the 7 primary claims at most 7 x that: supported; seeds with Sink_1 >= 1/16, 0 of 12 against 12
    of 12, by Fisher's exact test: 2 / C(24, 12). v2 has no ce arm."""
    from study import study_results

    def record(variant, seed):
        weight = dict(softmax=0.3, sink=0.02, gated=0.05, affine=0.01)[variant] + 0.001 * seed
        rate = 0.2 if variant == 'softmax' else 0.0
        return dict(arm='kd', variant=variant, seed=seed,
                    teacher=f'teacher_softmax_s{101 + (seed - 1) % 2}',
                    settings=dict(matched_init=True), first_token_weight=[weight] * 4,
                    first_token_share=[weight] * 4,
                    entropy=[2.0 + 0.01 * seed] * 4, final_kd_loss=0.05, spikes={'9': 30},
                    spikes_after_warmup={'9': 10},
                    end=dict(gu=dict(sink_rate=rate, sink_rate_raw=rate), w8a8=dict(ratio=1.0),
                             knockout=dict(ratio_first_0=1.0), row_total_std=[0.1] * 4))
    records = [record(v, s) for v in ('softmax', 'sink', 'gated', 'affine') for s in range(1, 13)]
    claims = {c['id']: c for c in study_results.test_claims(records, 'v2')}
    assert len(claims) == 34 and {c['arm'] for c in claims.values()} == {'kd'}
    assert sum(c['family'] == 'primary' for c in claims.values()) == 7
    first = claims['fig4_affine_sink']
    assert (first['test'] == 'exact sign-flip, paired by seed'
            and first['p'] == pytest.approx(2 / 4096))
    assert first['p_holm'] <= 7 * 2 / 4096 and first['verdict'].startswith('supported')
    assert (claims['gu16_affine']['test'] == "Fisher's exact"
            and claims['gu16_affine']['p'] == pytest.approx(2 / math.comb(24, 12)))
    assert claims['layer3_affine_sink']['source'] == 'Figure 4, layer 3 (our reading)'
    assert study_results.claims_table('v2')[2].endswith('| exact sign-flip, paired by seed |')


def test_the_gpu_plan_and_its_cpu_dry_run(study_data, tmp_path):
    """--plan=gpu: v2's design larger (students of 8 layers, 256 wide, 256-token windows; one
    teacher 3.26x their parameters, seed 101; seeds 1-3, 12M tokens a run, on cuda). Without a GPU,
    its dry run on the CPU (a few steps a run, one seed) goes through every stage: the teacher, a
    student of each variant, the end measures, the records (each naming the seal) and the report."""
    from study import sink_study
    from helpers import seal_here
    argv = ['--plan=gpu', f'--data_dir={study_data}', f'--out_dir={tmp_path / "out"}',
            '--report_only=True']
    runs, steps, per_step = sink_study.plan_runs(*sink_study.parse_args(argv))
    assert sorted(r['name'] for r in runs) == sorted(['teacher_softmax_s101'] + [
        f'kd_{v}_s{s}' for v in ('softmax', 'sink', 'gated', 'affine') for s in (1, 2, 3)])
    student, teacher = runs[1]['config'], runs[0]['config']
    assert (student.n_layer, student.n_embd, student.block_size, student.device) == (8, 256, 256,
                                                                                     'cuda')
    assert (teacher.n_layer, teacher.n_embd, runs[0]['name']) == (12, 384, 'teacher_softmax_s101')
    assert (steps * per_step == 732 * 64 * 256 and student.matched_init
            and student.no_decay == NO_DECAY)
    report = seal_here(tmp_path / 'report')
    results = sink_study.main(['--plan=gpu', f'--data_dir={study_data}',
                               f'--out_dir={tmp_path / "out"}',
                               f'--report_dir={report}', *GPU_DRY_RUN])
    assert sorted(r['name'] for r in results['runs']) == sorted(
        ['teacher_softmax_s101'] + [f'kd_{v}_s1' for v in ('softmax', 'sink', 'gated', 'affine')])
    assert all(r['seal'] == 'a' * 40 and r['tokens'] == 384 for r in results['runs'])
    assert results['layers'] == 8 and (report / 'report.md').is_file()


# docs/analysis.md's dry run of --plan=gpu on a CPU: one seed, 3 steps a run, the shapes' widths and
# windows cut
GPU_DRY_RUN = ['--device=cpu', '--kd_seeds=1', '--tokens=384', '--global_batch_size=2',
               '--micro_batch_size=2',
               '--block_size=64', '--n_embd=64', '--n_head=2', '--n_kv_head=1',
               '--intermediate_size=192', '--compile=False', '--eval_batches=1', '--jobs=2']


# -----------------------------------------------------------------------------------------------
# The reading (issue 50): what the records say beyond each study's claims, recomputed here from the
# records

def exact_p(a, b, claim, get):
    """The claim's p from its groups (records by seed) by brute force: every sign flip for matched
    pairs, every subset for Fisher's, every labelling within teachers for v1's unmatched groups."""
    va, vb = ({s: get(r) for s, r in side.items()} for side in (a, b))
    if claim['measure'] in ('sink_grown', 'sink_grown16'):
        return fisher_by_subsets(int(sum(va.values())), len(va), int(sum(vb.values())), len(vb))
    matched = all(r.get('settings', {}).get('matched_init') for r in [*a.values(), *b.values()])
    if matched and sorted(va) == sorted(vb):
        return every_sign_flip([va[s] - vb[s] for s in sorted(va)])
    teacher = lambda side: [r['teacher'] for r in side.values()]
    strata = (teacher(a), teacher(b)) if claim['arm'] == 'kd' else ([0] * len(a), [0] * len(b))
    return every_labelling(list(va.values()), list(vb.values()), *strata)


def group(records, arm, variant):
    """{seed: record} of a variant's runs in the arm; a group variant@arm (v4's affine@decay):
    that arm's."""
    variant, _, own_arm = variant.partition('@')
    return {r['seed']: r for r in records if r['arm'] == (own_arm or arm)
            and r['variant'] == variant and r['seed'] != 0}


def reading_value(records, claim):
    """A claim's measure read from a record: value(), the held-out loss, or (v3's share_sink) the
    first-token share over the layers where the arm's softmax seeds' mean Gu et al. Sink_1 is at
    least 1/16."""
    if claim['measure'] == 'val_loss':
        return lambda r: r['val_loss']
    if claim['measure'] == 'share_sink':
        softmax = list(group(records, claim['arm'], 'softmax').values())
        rates = np.mean([r['end']['gu']['sink_rate_per_layer'] for r in softmax], axis=0)
        layers = [i for i, x in enumerate(rates) if x >= 1 / 16]
        return lambda r: float(np.mean([r['first_token_share'][i] for i in layers]))
    return lambda r: value(r, claim['measure'])


def check_reading_claims(rows, records):
    """Each exploratory comparison: its values and p from the records, Holm within its (arm, family)
    and its word."""
    for claim in rows:
        get = reading_value(records, claim)
        try:
            a, b = ({s: r for s, r in group(records, claim['arm'], v).items() if get(r) is not None}
                    for v in (claim['low'], claim['high']))
        except KeyError:  # a v1 record made before the measure existed
            assert claim['verdict'] == 'not measured' and claim['n'] == [0, 0], claim['id']
            continue
        assert claim['mean'] == pytest.approx([np.mean([get(r) for r in a.values()]),
                                               np.mean([get(r) for r in b.values()])],
                                              abs=1e-12), claim['id']
        assert claim['p'] == pytest.approx(exact_p(a, b, claim, get), abs=1e-9), claim['id']
        if claim['below'] is not None:
            assert claim['below'] == [sum(get(a[s]) < get(b[s]) for s in a), len(a)]
    for arm in {c['arm'] for c in rows}:
        # a family: the claims another set registered, or the losses
        for label in {c['label'] for c in rows}:
            chosen = [c for c in rows if c['arm'] == arm and c['label'] == label]
            check_holm_and_verdicts([c for c in chosen if c['direction'] != '!='] or [],
                                    holm_over=chosen)
            for c in (c for c in chosen if c['direction'] == '!='):
                lower = c['low'] if c['mean'][0] < c['mean'][1] else c['high']
                assert c['verdict'] == (f"{lower} lower (p = {c['p_holm']:.3g})"
                                        if c['p_holm'] < 0.05 else
                                        f"no detectable difference (p = {c['p_holm']:.3g})")


def layer_mean_of(runs, key):
    return np.mean([r[key] for r in runs], axis=0)


def check_where_from(reading, records, uniform):
    for w in reading['where_from']:
        softmax = list(group(records, w['arm'], 'softmax').values())
        rates = layer_mean_of([r['end']['gu'] for r in softmax], 'sink_rate_per_layer')
        assert w['sink_layers'] == [k + 1 for k, x in enumerate(rates) if x >= 1 / 16]
        a, b = (group(records, w['arm'], v) for v in (w['low'], w['high']))
        for name, key in (('weight', 'first_token_weight'), ('share', 'first_token_share'),
                          ('row_total', 'row_sum'), ('null_mass', 'null_mass')):
            for side, runs in zip(w[name], (a, b)):
                assert side == pytest.approx(layer_mean_of(runs.values(), key), abs=1e-12)
        gap = layer_mean_of(a.values(), 'first_token_weight') - layer_mean_of(b.values(),
                                                                              'first_token_weight')
        for part in w['parts']:
            if not part['layers']:
                continue
            idx = [k - 1 for k in part['layers']]
            assert part['gap_fraction'] == pytest.approx(gap[idx].sum() / gap.sum())
            share = lambda r: np.mean([r['first_token_share'][i] for i in idx])
            claim = dict(measure='share', arm=w['arm'])
            assert part['share_p'] == pytest.approx(exact_p(a, b, claim, share), abs=1e-9)


def check_payoff_and_teachers(reading, records, teachers, narrower):
    """narrower: the formats (w8a4, ...) whose loss ratio the study's primary family tests."""
    for p in reading['payoff']:
        runs = [r for r in records if r['arm'] == p['arm']]
        ratio = lambda r, q: r['end']['payoff'][q] / r['end']['w8a8']['fp']
        assert sorted(p.get('narrower', {})) == sorted(f'ratio_{q}' for q in narrower)
        for q in narrower:  # each format's loss ratio over the full-precision loss, less 1
            assert p['narrower'][f'ratio_{q}'] == pytest.approx(
                [min(ratio(r, q) for r in runs) - 1, max(ratio(r, q) for r in runs) - 1],
                abs=1e-12)
        for variant, ranges in p['variants'].items():
            mine = [r for r in runs if r['variant'] == variant]
            for q in narrower:
                assert ranges[f'ratio_{q}'] == pytest.approx(
                    [min(ratio(r, q) for r in mine), max(ratio(r, q) for r in mine)], abs=1e-12)
            ratios = [r['end']['w8a8']['w8a8'] / r['end']['w8a8']['fp'] for r in mine]
            assert ranges['w8a8'] == pytest.approx([min(ratios), max(ratios)], abs=1e-12)
            assert ranges['residual_max'] == [min(max(r['residual_max_abs']) for r in mine),
                                              max(max(r['residual_max_abs']) for r in mine)]
            assert ranges['kurtosis'] == [min(max(r['attention_kurtosis']) for r in mine),
                                          max(max(r['attention_kurtosis']) for r in mine)]
        moved = max(abs(r['end']['w8a8']['w8a8'] / r['end']['w8a8']['fp'] - 1) for r in runs)
        assert (p['at_floor'] == (moved <= 0.01)
                and p['largest_w8a8_change'] == pytest.approx(moved, abs=1e-12))
    by_name = {r['name']: r for r in records}
    t = reading['teachers']
    assert [x['name'] for x in t['teachers']] == teachers
    assert all(x['first_token_weight'] == by_name[x['name']]['first_token_weight'] and
               x['val_loss'] == by_name[x['name']]['val_loss'] for x in t['teachers'])
    students = list(group(records, 'kd', 'softmax').values())
    assert t['students']['val_loss'] == pytest.approx(np.mean([r['val_loss'] for r in students]),
                                                      abs=1e-12)
    assert t['students']['first_token_weight'] == pytest.approx(layer_mean_of(students,
                                                                              'first_token_weight'))


@pytest.mark.parametrize('study, left_out, narrower', [
    ('sink_study_v4', [], ['w8a4']),
    ('sink_study_v3', [], ['w8a4']),
    ('sink_study_v2',
     ['fig4_null_affine_sink', 'fig4_null_sink_softmax', 'fig3_spread_affine_sink', 'gu_affine',
      'gu_sink', 'gu_gated'], []),
    ('sink_study', ['deep_affine_sink', 'deep_sink_softmax'], [])])
def test_the_reading_recomputed_from_the_committed_records(study, left_out, narrower):
    """Issue 50: every study's results.json holds its reading, and each number of it recomputes from
    the records: the claims another registered set tested that this set left out (v3: none; v2:
    the six of v1 whose test v2's set does not hold; v1: all of v2's that v1's does not), the
    held-out loss beside each loss claim and gated against affine (v3's set tests them), where
    each first-token difference comes from, the payoff's ranges (v3's W8A4 too) and the
    teachers'."""
    from study import study_results
    results, records = committed(study)
    reading = results['reading']
    own = results.get('claim_set', 'v1')
    other = reading['other_claims']
    # every claim of another set (in the sets' order, each test once) whose test is neither this
    # set's nor the held-out loss's, on the layers the model has
    held_out = {('val_loss', 'affine', '<', 'softmax'), ('val_loss', 'affine', '<', 'sink'),
                ('loss', 'gated', '!=', 'affine'), ('val_loss', 'gated', '!=', 'affine')}
    # and whose both sides the study trained (v4's head-wise gate and decay arm are not v1-v3's),
    # a set left out where none of those claims' measures is in a record (v4's held-out set)
    first_arm = 'kd' if any(r['arm'] == 'kd' for r in records) else 'ce'

    def trained(group):
        variant, _, arm = group.partition('@')
        return any(r['variant'] == variant and r['arm'] == (arm or first_arm) for r in records)

    def in_a_record(measure):
        def held(record):
            try:
                return value(record, measure) is not None
            except KeyError:  # a measure made after the record
                return False
        return measure == 'share_sink' or any(held(r) for r in records)

    seen, expected = {c[3:] for c in study_results.CLAIM_SETS[own][0]} | held_out, []
    for name, (claims, _) in study_results.CLAIM_SETS.items():
        extra = []
        for c in claims:
            deeper = c[3].startswith('weight_l') and int(c[3][8:]) > results['layers']
            if (name != own and c[3:] not in seen and not deeper and trained(c[4])
                    and trained(c[6])):
                seen.add(c[3:])
                extra.append(c)
        if any(in_a_record(c[3]) for c in extra):
            expected += [c[0] for c in extra]
    assert [c['id'] for c in other] == expected and expected[:len(left_out or [])] == (left_out
                                                                                       or [])
    check_reading_claims(other, records)
    losses = reading['loss_claims']
    # the held-out loss beside each loss claim of the set, and gated against affine on both
    # losses, less the tests the set holds (v3's all; v4's head-wise claims' held-out twins not)
    own_claims = study_results.CLAIM_SETS[own][0]
    twins = {('val_loss', *c[4:]) for c in own_claims if c[3] == 'loss'} | held_out
    assert {(c['measure'], c['low'], c['direction'], c['high']) for c in losses
            if c['arm'] == 'kd'} == twins - {c[3:] for c in own_claims}
    check_reading_claims(losses, records)
    check_where_from(reading, records, results['uniform_first_token'])
    check_payoff_and_teachers(reading, records, results['teachers'], narrower)
    with open(os.path.join(ROOT, 'docs', study, 'report.md')) as f:
        report = f.read()
    assert '## What the records say beyond the registered claims (exploratory)' in report


def test_v3s_payoff_was_chosen_by_its_rule_on_the_pilot():
    """v3's payoff (study_results.PAYOFF_V3) is what the rule committed before the pilot's last run
    picks from the pilot's softmax records, recomputed here: the first of W8A6, W4A8, W8A4 whose
    loss ratio is above 1.01 in every seed, or none; the pilot's seeds are 900 and up;
    docs/analysis.md shows the pilot's block and v3's claims."""
    from study import study_results
    pilot = os.path.join(ROOT, 'docs', 'sink_study_v3', 'pilot')
    records = []
    for name in sorted(os.listdir(os.path.join(pilot, 'runs'))):
        with open(os.path.join(pilot, 'runs', name)) as f:
            records.append(json.load(f))
    assert all(r['seed'] >= 900 for r in records) and {r['variant'] for r in records} == {'softmax'}
    students = [r for r in records if r['arm'] == 'kd']
    assert len(students) == 3
    above = [m for m in ('w8a6', 'w4a8', 'w8a4')
             if all(r['end']['payoff'][m] / r['end']['w8a8']['fp'] > 1.01 for r in students)]
    assert study_results.PAYOFF_V3 == (f'ratio_{above[0]}' if above else None)
    primary = {c[3] for c in study_results.CLAIMS_V3 if c[1] == 'primary'}
    assert (study_results.PAYOFF_V3 in primary) == bool(above)
    with open(os.path.join(pilot, 'results.json')) as f:
        results = json.load(f)
    got = block('docs/analysis.md',
                "<!-- v3's payoff pilot: "
                "study_results.payoff_pilot_lines(docs/sink_study_v3/pilot/results.json) -->",
                "<!-- end of v3's payoff pilot -->")
    assert got == '\n'.join(study_results.payoff_pilot_lines(results))
    got = block('docs/analysis.md', "<!-- v3's claims: study_results.claims_table('v3') -->",
                "<!-- end of v3's claims -->")
    assert got == '\n'.join(study_results.claims_table('v3'))
