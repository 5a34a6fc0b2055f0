"""The sink study (sink_study.py) and what it rests on: windows that start with a fixed token, the standard-library
corpus, the study's measurements against an independent recomputation, its verdicts, and the README's numbers."""
import json
import os

import numpy as np
import pytest

import prepare_data
from data import Windows, first_token_id, prefix_id, read_meta, read_shard
from files import RunError


def test_prefix_windows_start_with_the_token_and_cover_every_token_once(data_dir):
    """first_token='prefix': every window is [token] + block_size - 1 stream tokens, and its targets are the next
    block_size stream tokens; windows do not overlap, so each stream token is a target exactly once."""
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
    assert first_token_id({}, read_meta(data_dir)['tokenizer']) is None  # a run from before the key
    assert first_token_id({'first_token': 'prefix'}, read_meta(data_dir)['tokenizer']) == 256


def test_prefix_needs_a_token():
    with pytest.raises(RunError, match="neither a BOS nor an end-of-text token"):
        prefix_id(dict(spec='tok', bos_id=None, eos_id=None))


def test_stdlib_corpus_is_recorded(tmp_path):
    """--source=stdlib: the standard library's .py files, their count, size and sha256 in meta.json."""
    documents, described = prepare_data.stdlib_corpus()
    assert described['files'] == len(documents) > 500 and described['bytes'] > 5_000_000
    out = tmp_path / 'stdlib'
    prepare_data.main(['--source=stdlib', '--tokenizer=bytes', f'--out_dir={out}', '--val_every=50', '--num_proc=1',
                       '--max_tokens=20000'])
    source = read_meta(out)['settings']['source']
    assert source['corpus'] == described and source['python']
    first = read_shard(str(out / 'train_000000.bin'))[:200]
    assert bytes(first.astype(np.uint8)) == documents[1].encode()[:200]  # document 0 is held out (0 mod 50)


def test_the_study_end_to_end(data_dir, tmp_path):
    """sink_study.py on a few thousand tokens (softmax and affine, a CE and a KD run each): results.json as documented,
    report.md and the figures; each run's first-token weights agree with a recomputation from its checkpoint through
    another path: transformers' eager attentions of the exported softmax model, the float64 references of
    test_model.py (written from the paper's equations) for the others; and a re-run trains nothing."""
    import torch
    from transformers import AutoModelForCausalLM
    import export_hf
    import sink_study
    from checkpoint import read_checkpoint
    from model import GPT
    from test_analyze import explicit_weights
    from test_probes import gu_metric
    out = tmp_path / 'study'
    argv = [f'--out_dir={out}', f'--data_dir={data_dir}', '--variants=softmax,affine', '--seeds=0',
            '--kd_seeds=0', '--tokens=4096', '--block_size=32', '--compile=False']
    results = sink_study.main(argv)
    assert json.loads((out / 'results.json').read_text()) == json.loads(json.dumps(results))
    assert results['schema_version'] == 1 and results['bos_id'] == 256 and results['context'] == 32
    assert results['corpus']['source'] == 'builtin' and results['teacher'].endswith('ce_softmax_s0')
    assert results['uniform_first_token'] == pytest.approx(sum(1 / (i + 1) for i in range(1, 32)) / 31)
    assert [(r['arm'], r['variant']) for r in results['runs']] == [
        ('ce', 'softmax'), ('ce', 'affine'), ('kd', 'softmax'), ('kd', 'affine')]
    for name in ('report.md', 'fig4_ce.png', 'fig4_kd.png', 'curves_ce.png', 'curves_kd.png'):
        assert (out / name).is_file()
    report = (out / 'report.md').read_text()
    assert 'first-token weight affine < sink < softmax' in report and '## KD arm' in report
    windows = Windows(data_dir, 'val', 32, 256).get(range(8))[0]  # the study's fixed windows (attention_windows)
    idx = torch.from_numpy(windows)
    for run in results['runs']:
        assert run['tokens'] == 4096 and len(run['curve']) >= 2 and run['curve'][-1]['tokens'] == 4096
        assert run['sink_mass'] is None  # (probes.sink_record's sink mass: tests/test_analyze.py)
        model = GPT.from_pretrained(run['ckpt']).eval()
        if run['variant'] == 'softmax' and run['arm'] == 'ce':  # through transformers
            ckpt = read_checkpoint(run['ckpt'])
            export_hf.export(model, ckpt['tokenizer'], str(tmp_path / 'hf'), check=False)
            hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / 'hf'), attn_implementation='eager').double()
            attentions = hf(idx, output_attentions=True).attentions
        else:
            attentions = explicit_weights(model.double(), idx)
        recomputed = [a[:, :, 1:, 0].mean().item() for a in attentions]
        assert run['first_token_weight'] == pytest.approx(recomputed, abs=2e-6)
        w = torch.stack(attentions, 1)  # Gu et al.'s Sink_1 on these windows (its reference: tests/test_probes.py)
        rows = w if model.config.variant.rows_sum_to_one else w.abs() / (w.abs().sum(-1, keepdim=True) + 1e-8)
        assert run['sink_rate'] == pytest.approx(gu_metric(rows)[:, 0].mean().item(), abs=1e-7)
    # every reader of these checkpoints puts the token first, as their training windows had it
    import analyze
    import eval_zeroshot
    ce = str(out / 'runs' / 'ce_affine_s0')
    assert eval_zeroshot.window_first_token(ce) == 256
    analyze.main(['attention', ce, f'--out_dir={tmp_path / "attention"}', f'--data={data_dir}', '--num_seqs=2',
                  '--seq_len=32', '--sink_samples=4'])
    numbers = json.loads((tmp_path / 'attention' / 'numbers.json').read_text())
    assert [m['first_token'] for m in numbers['models'].values()] == [256]
    model = GPT.from_pretrained(ce).eval()
    ids = list(range(97, 97 + 64))
    with_token = eval_zeroshot.c4_perplexity(model, ids, 2, 32, 2, first_token=256)
    by_hand = torch.tensor([[256] + ids[:31], [256] + ids[31:62]])
    logits, _ = model(by_hand)
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), by_hand[:, 1:].reshape(-1))
    assert with_token['nll'] == pytest.approx(nll.item(), rel=1e-5)
    stamp = (out / 'runs' / 'ce_softmax_s0' / 'ckpt.pt').stat().st_mtime_ns
    sink_study.main(argv)  # finished runs are skipped
    assert (out / 'runs' / 'ce_softmax_s0' / 'ckpt.pt').stat().st_mtime_ns == stamp


def test_verdicts_follow_the_numbers_and_the_noise():
    """A claim holds where every predicted order is beyond two standard errors; ties and single seeds are said."""
    import sink_study

    def run(variant, weight, seed):
        return dict(arm='ce', variant=variant, seed=seed, first_token_weight=[weight], first_token_share=[weight],
                    entropy=[1.0], val_loss=1.0, spikes={'6': 0, '9': 0})
    results = dict(arms=['ce'], runs=[run('affine', 0.010, 0), run('affine', 0.011, 1), run('sink', 0.020, 0),
                                      run('sink', 0.021, 1), run('softmax', 0.0205, 0), run('softmax', 0.30, 1)])
    line = next(l for l in sink_study.verdicts(results) if l.startswith('- first-token weight'))
    assert '**holds in part**' in line and 'affine 0.0105 < sink 0.0205' in line and '(within noise)' in line
    spikes = next(l for l in sink_study.verdicts(results) if 'k = 6' in l)
    assert '**does not hold**' in spikes and 'affine 0 = softmax 0' in spikes
    results['runs'] = [r for r in results['runs'] if r['seed'] == 0]
    line = next(l for l in sink_study.verdicts(results) if l.startswith('- first-token weight'))
    assert 'one seed: no estimate of the noise' in line


README_START = '<!-- the sink study: sink_study.readme_lines(docs/sink_study/results.json) -->'
README_END = '<!-- end of the sink study -->'


def test_the_readme_shows_the_committed_study():
    """The README's study numbers are those of the committed results.json (sink_study.readme_lines), and the report
    and figures it points to are committed beside it."""
    import sink_study
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'docs', 'sink_study', 'results.json')) as f:
        results = json.load(f)
    with open(os.path.join(root, 'README.md')) as f:
        readme = f.read()
    assert readme.count(README_START) == readme.count(README_END) == 1
    block = readme.split(README_START)[1].split(README_END)[0].strip('\n')
    expected = '\n'.join(sink_study.readme_lines(results))
    assert block == expected, f"README.md's study block is not the committed results'; it should read:\n{expected}"
    for name in ('report.md', 'fig4_ce.png', 'fig4_kd.png', 'curves_ce.png', 'curves_kd.png'):
        assert os.path.getsize(os.path.join(root, 'docs', 'sink_study', name)) > 1000, name
    assert results['schema_version'] == sink_study.SCHEMA_VERSION
