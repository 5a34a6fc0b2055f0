"""analyze.py's statistics against direct computations from an explicit attention matrix built
here."""
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

import analyze
import prepare_data
from lmkit import probes, sink_costs
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from helpers import ROOT, fake_run, write_task_data
from lmkit.errors import RunError
from model import ATTENTIONS, GPT, ModelConfig, rope_cos_sin
from test_eval_zeroshot import unreachable_hub
from test_model import REFERENCES, variant_name


@torch.no_grad()
def explicit_weights(model, idx):
    """Every layer's effective weights, built from the paper's equations with the model's parameters
    (each variant's float64 reference in test_model.py)."""
    cfg = model.config
    out, x = [], model.model.embed_tokens(idx).double()
    T = idx.size(1)
    positions = torch.arange(T)
    cos, sin = (t.double() for t in rope_cos_sin(cfg, positions))
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in model.model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = a.project(h, cos, sin)
        k = k.repeat_interleave(cfg.n_head // cfg.n_kv_head, dim=1)
        e = torch.where(visible, torch.exp(q @ k.transpose(-2, -1) / math.sqrt(cfg.head_dim)),
                        torch.zeros(()))
        p = {n: t.double() for n, t in [*a.named_parameters(), *a.named_buffers()]}
        out.append(REFERENCES[variant_name(cfg)](e=e, p=p, x=h, cfg=cfg, visible=visible,
                                                 seq_lens=None))
        x = layer(x, cos, sin, positions)
    return out


def tiny_model(attention, seed=0):
    torch.manual_seed(seed)
    model = GPT(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64,
                            vocab_size=300, block_size=32, attention=attention, init_std=0.3))
    for m in model.modules():
        if hasattr(m, 'alpha_ma'):
            m.alpha_ma.uniform_(0.2, 0.8)
    return model


@pytest.mark.parametrize('attention', ATTENTIONS)
def test_attention_statistics_match_the_explicit_matrix(attention):
    model = tiny_model(attention).double()
    idx = torch.randint(0, 300, (3, 16))
    stats = probes.attention_statistics(model, idx, corner=5)
    for s, w in zip(stats, explicit_weights(model, idx)):
        assert torch.allclose(s['first_token'], w[:, :, 1:, 0].mean(dim=(1, 2)), rtol=1e-9)
        assert torch.allclose(s['first_token_head'], w[:, :, 1:, 0].mean(2), rtol=1e-9)
        share = [[[w[b, h, i, 0] / w[b, h, i, :i + 1].sum() for i in range(1, 16)]
                  for h in range(4)] for b in range(3)]
        assert torch.allclose(s['first_token_share'],
                              torch.tensor(share, dtype=torch.float64).mean(dim=(1, 2)))
        assert torch.allclose(s['row_sums'], w.sum(-1).mean(1), rtol=1e-9)
        assert torch.allclose(s['head_total'], w.sum(-1).mean(2), rtol=1e-9)
        for b in range(3):
            entropies = []  # written out entry by entry
            for h in range(4):
                for i in range(1, 16):
                    p = w[b, h, i, :i + 1].abs()
                    p = p / p.sum()
                    entropies.append(-(p * p.log()).sum().item())
            assert s['entropy'][b].item() == pytest.approx(np.mean(entropies), rel=1e-9)
        assert torch.allclose(s['corner'], w[:, :, :5, :5].mean(1))
        if attention in ('softmax', 'gated'):
            assert torch.allclose(s['row_sums'], torch.ones(3, 16, dtype=torch.float64))
        if attention == 'sink':
            assert s['row_sums'].max() < 1 and s['sinks'].shape == (4,)
        # the sink's mass: what each row's real weights leave of 1
        if attention in ('sink', 'softmax1'):
            assert torch.allclose(s['sink_mass'], 1 - w[:, :, 1:].sum(-1).mean(dim=(1, 2)))
        else:
            assert s['sink_mass'] is None
        if 'affine' in attention:
            assert s['row_sums'].min() != s['row_sums'].max() and s['alpha'].shape == (3, 16, 4)


def test_model_statistics_are_the_same_for_any_batch_size():
    model = tiny_model('affine')
    idx = torch.randint(0, 300, (4, 16))
    one = sink_costs.model_statistics(model, idx, 5, batch_size=1)
    all_four = sink_costs.model_statistics(model, idx, 5, 4)
    assert json.dumps(one)[:200] and one['row_sums']['n'] == 4 * 16 * 2
    for a, b in zip(one['layers'], all_four['layers']):
        for key in ('first_token', 'entropy', 'row_sum_mean', 'row_sum_median'):
            assert a[key] == pytest.approx(b[key], rel=1e-6)
        assert np.allclose(a['corner'], b['corner']) and np.allclose(a['alpha_head_mean'],
                                                                     b['alpha_head_mean'])
    # the pooled row sums of Figure 3: every query of every layer
    w = explicit_weights(model.double(), idx)
    pooled = torch.cat([layer.sum(-1).mean(1).flatten() for layer in w])
    assert one['row_sums']['mean'] == pytest.approx(pooled.mean().item(), rel=1e-5)
    assert sum(one['row_sums']['histogram']['counts']) == len(pooled)


def test_grad_norm_statistics_and_spikes_on_a_known_series():
    rng = np.random.default_rng(0)
    g = 1.0 + 0.01 * rng.standard_normal(600)
    g[[10, 200, 450]] = [5.0, 3.0, 1.2]  # two clear spikes and one small bump
    median = np.median(g[:500])
    mad = np.median(np.abs(g[:500] - median))
    # the bump is itself over the k = 9 threshold of this very quiet series
    assert 1.2 > median + 9 * mad
    counts = analyze.spike_counts(g, ks=(6, 9))
    assert counts == {6: 3, 9: 3}
    counts = analyze.spike_counts(g, ks=(6, 9), start=100, end=300)
    assert counts == {6: 1, 9: 1}
    s = analyze.grad_norm_statistics(g, 0, 500)
    assert (s['mean'] == pytest.approx(g[:500].mean())
            and s['variance'] == pytest.approx(g[:500].var()))
    assert s['cv'] == pytest.approx(g[:500].std() / g[:500].mean())
    with pytest.raises(ValueError, match='only 600 steps'):
        analyze.spike_counts(g, end=700)


def test_runs_report_writes_tables_figures_and_numbers(tmp_path):
    quiet = [1.0 + 0.001 * (i % 7) for i in range(600)]
    spiky = list(quiet)
    spiky[50] = spiky[300] = 10.0
    fake_run(tmp_path / 'softmax', 'softmax', spiky, kd=True)
    fake_run(tmp_path / 'affine', 'affine', quiet, kd=True)
    out = tmp_path / 'report'
    analyze.main(['runs', str(tmp_path / 'softmax'), str(tmp_path / 'affine'), f'--out_dir={out}',
                  '--late=100'])
    numbers = json.loads((out / 'numbers.json').read_text())['runs']
    softmax = numbers[str(tmp_path / 'softmax')]
    assert softmax['spikes'] == {'6': 2,
                                 '9': 2} and numbers[str(tmp_path / 'affine')]['spikes'] == {'6': 0,
                                                                                             '9': 0}
    assert softmax['grad_norm']['mean'] == pytest.approx(np.mean(spiky[:500]))
    # the KD loss when every run logs it
    assert softmax['final_loss'] == pytest.approx(1.0 - 600 / 2000)
    report = (out / 'report.md').read_text()
    assert '| Baseline | 2 | 2 |' in report and '| Affine-Scaled | 0 | 0 |' in report
    for name in ('fig2_attn_logit.png', 'fig7_loss.png', 'fig8_grad_norm.png',
                 'fig10_loss_late.png'):
        assert (out / name).stat().st_size > 1000 and f'({name})' in report


def test_runs_report_bad_input_leaves_no_report(tmp_path):
    fake_run(tmp_path / 'a', 'softmax', [1.0] * 100)
    fake_run(tmp_path / 'b', 'affine', [1.0] * 600, n_layer=4)
    fake_run(tmp_path / 'c', 'affine', [1.0] * 600)
    (tmp_path / 'empty').mkdir()
    out = tmp_path / 'report'
    for dirs, message in [(['a', 'c'], 'asked for steps 0-500, but the run has only 100 steps; '
                                       'give a window within it, e.g. --window=0,100'),
                          (['b', 'c'], 'different model sizes'),
                          (['empty'], 'no metrics.jsonl')]:
        with pytest.raises(RunError, match=message):
            analyze.main(['runs', *(str(tmp_path / d) for d in dirs), f'--out_dir={out}'])
        assert not out.exists()


def save_checkpoint(path, model):
    """A checkpoint as train.py writes it (the keys analyze.py reads), with the byte tokenizer."""
    path.mkdir(parents=True)
    torch.save(dict(model=model.state_dict(), model_config=asdict(model.config),
                    tokenizer=tokenizer_info(load_tokenizer('bytes'), 'bytes')),
               path / 'ckpt.pt')
    return str(path)


TEXT = "".join(f"Line {i}: {i * i} is its square and {i ** 3} its cube.\n" for i in range(60))


def test_heldout_sequences_from_text_and_token_shards(tmp_path):
    enc = load_tokenizer('bytes')
    sha = tokenizer_info(enc, 'bytes')['sha256']
    (tmp_path / 'text.txt').write_text(TEXT)
    seqs = analyze.heldout_sequences(str(tmp_path / 'text.txt'), enc, sha, num_seqs=5, seq_len=32,
                                     seed=1)
    ids = np.frombuffer(TEXT.encode(), dtype=np.uint8)
    # non-overlapping, from the start
    windows = {tuple(ids[i:i + 32]) for i in range(0, len(ids) - 31, 32)}
    assert seqs.shape == (5, 32) and len({tuple(s.tolist()) for s in seqs}) == 5
    assert all(tuple(s.tolist()) in windows for s in seqs)
    assert torch.equal(seqs,
                       analyze.heldout_sequences(str(tmp_path / 'text.txt'), enc, sha, 5, 32,
                                                 seed=1))
    with pytest.raises(RunError, match='fewer than --num_seqs=1000'):
        analyze.heldout_sequences(str(tmp_path / 'text.txt'), enc, sha, 1000, 32)
    prepare_data.main([f'--source={tmp_path / "text.txt"}', '--tokenizer=bytes',
                       f'--out_dir={tmp_path / "data"}', '--txt_sample_by=line', '--val_every=2'])
    seqs = analyze.heldout_sequences(str(tmp_path / 'data'), enc, sha, 3, 32)
    assert seqs.shape == (3, 32)
    with pytest.raises(RunError, match="not the model's tokenizer"):
        analyze.heldout_sequences(str(tmp_path / 'data'), enc, 'another tokenizer', 3, 32)


def test_attention_job_writes_every_figure_and_the_numbers(tmp_path):
    (tmp_path / 'text.txt').write_text(TEXT)
    specs = [save_checkpoint(tmp_path / a, tiny_model(a)) for a in ('softmax', 'sink', 'affine')]
    out = tmp_path / 'report'
    analyze.main(['attention', *specs, f'--out_dir={out}', f'--data={tmp_path / "text.txt"}',
                  '--num_seqs=4',
                  '--corner=8', '--batch_size=3', '--sink_samples=7', '--calibration=2'])
    numbers = json.loads((out / 'numbers.json').read_text())
    models = numbers['models']
    assert list(models) == ['Baseline', 'Sink', 'Affine-Scaled'] and numbers['layer'] == 1
    assert models['Baseline']['row_sums']['mean'] == pytest.approx(1.0)
    assert models['Sink']['row_sums']['mean'] < 1 and 'sinks' in models['Sink']['layers'][0]
    assert len(models['Affine-Scaled']['layers'][1]['alpha_ma']) == 4
    # the numbers are those of the function on the same sequences
    enc = load_tokenizer('bytes')
    seqs = analyze.heldout_sequences(str(tmp_path / 'text.txt'), enc,
                                     tokenizer_info(enc, 'bytes')['sha256'], 4, 32)
    direct = sink_costs.model_statistics(tiny_model('affine'), seqs, 8)
    assert (models['Affine-Scaled']['layers'][1]['first_token']
            == pytest.approx(direct['layers'][1]['first_token']))
    affine = models['Affine-Scaled']
    for key in ('first_token_share', 'null_mass', 'first_or_null', 'sink_rate',
                'value_weighted_first', 'alpha_std',
                'attention_kurtosis_after_first', 'residual_max_abs'):
        assert affine['layers'][1][key] == pytest.approx(direct['layers'][1][key])
    assert affine['knockout'] == pytest.approx(
        sink_costs.knockout_losses(tiny_model('affine'), seqs))
    assert affine['w8a8']['fp'] == pytest.approx(
        sink_costs.prediction_loss(tiny_model('affine'), seqs))
    assert (affine['w8a8']['calibration'] == 2 and affine['gu']['samples'] == 7
            and affine['gu']['length'] == 32)
    assert ('sink_rate_null_slot' in models['Sink']['gu']
            and 'sink_rate_null_slot' not in affine['gu'])
    report = (out / 'report.md').read_text()
    for name in ('fig3_row_sums.png', 'fig4_first_token.png', 'fig5_head_total.png',
                 'fig6_entropy.png',
                 'fig9_heatmap_layer1.png', 'fig_alpha.png', 'fig_sinks.png',
                 'fig_first_token_share.png', 'fig_outliers.png', 'fig_knockout.png'):
        assert (out / name).stat().st_size > 1000 and f'({name})' in report
    for section in ('## First-token attention weight per layer (Figure 4)', "## Where each row's "
                                                                            "attention goes",
                    '## Sink_1^0.3 (Gu et al. 2025) over the model', '## Activation outliers per '
                                                                     'layer',
                    '## What a sink costs', '| Sink | '):
        assert section in report


def test_attention_job_bad_input_leaves_no_report(tmp_path):
    (tmp_path / 'text.txt').write_text(TEXT)
    small = save_checkpoint(tmp_path / 'small', tiny_model('softmax'))
    torch.manual_seed(0)
    big = save_checkpoint(tmp_path / 'big',
                          GPT(ModelConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=32,
                                          intermediate_size=64, vocab_size=300, block_size=32)))
    out = tmp_path / 'report'
    for args, message in [([small, big], 'different shapes'), ([small, '--seq_len=64'], "exceeds "
                                                                                        "the "
                                                                                        "model's "
                                                                                        "block"),
                          ([small, '--layer=5'], 'layers 1-2'),
                          ([str(tmp_path / 'nothing')], 'no such file')]:
        with pytest.raises(RunError, match=message):
            analyze.main(['attention', *args, f'--out_dir={out}', f'--data={tmp_path / "text.txt"}',
                          '--num_seqs=2', '--sink_samples=2'])
        assert not out.exists() and not (tmp_path / 'report.tmp').exists()


def table_run(path, attention, seed, loss, accs, c4=None, teacher='out/teacher', data_dir='data/a',
              **config):
    """A finished run as the table job reads it: config.json, metrics.jsonl and eval.json. With a
    teacher (as the paper's runs) its KD loss is `loss` and its total loss loss + 1; without one its
    (CE) loss is `loss`."""
    path.mkdir(parents=True)
    cfg = dict(attention=attention, seed=seed, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
               intermediate_size=64, vocab_size=300, teacher=teacher, data_dir=data_dir, **config)
    (path / 'config.json').write_text(json.dumps(cfg))
    kd = dict(kd_loss=loss, loss=loss + 1) if teacher else dict(loss=loss)
    records = [dict(step=1, loss=9.0, grad_norm=1.0, **({'kd_loss': 9.0} if teacher else {})),
               dict(step=2, **kd, grad_norm=1.0, val_loss=2.0, val_ppl=math.exp(2.0))]
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    results = {task: dict(acc=a, acc_norm=a + 0.01 if task == 'hellaswag' else None) for task,
               a in accs.items()}
    if c4:
        results['c4'] = dict(ppl=c4)
    (path / 'eval.json').write_text(json.dumps(results))
    return str(path)


def test_table_job_lays_out_tables_1_to_3(tmp_path):
    runs = [table_run(tmp_path / 'softmax', 'softmax', 0, 2.82, dict(hellaswag=0.45, boolq=0.60),
                      c4=71.7),
            table_run(tmp_path / 'sink', 'sink', 0, 2.83, dict(hellaswag=0.44, boolq=0.61),
                      c4=81.5),
            table_run(tmp_path / 'affine', 'affine', 0, 2.80, dict(hellaswag=0.46, boolq=0.58),
                      c4=70.6),
            table_run(tmp_path / 'sigmoid', 'affine', 0, 2.81, dict(hellaswag=0.40, boolq=0.50),
                      c4=75.0, affine_act='sigmoid')]
    out = tmp_path / 'table'
    analyze.main(['table', *runs, f'--out_dir={out}'])
    report = (out / 'report.md').read_text()
    # ΔParams: W_alpha is d x H per layer (2 * 32 * 4 = 256), the sink one logit per head (2 * 4 =
    # 8) only the tasks evaluated
    assert '| Method | ΔParams | KD loss | C4 PPL | PIQA |' not in report
    assert ('## KD from out/teacher, data data/a\n\n| Method | ΔParams | KD loss | C4 PPL | Hella '
            '| BoolQ | Avg. |'
            in report)
    # hellaswag: acc_norm; ties: both
    assert '| Baseline | 0 | 2.820 | 71.70 | 46.0 | 60.0 | **53.0** |' in report
    assert '| Sink | 8 | 2.830 | 81.50 | 45.0 | **61.0** | **53.0** |' in report
    assert ('| Affine-Scaled | 256 | **2.800** | **70.60** | **47.0** | 58.0 | **52.5** |'
            not in report)
    assert '| Affine-Scaled | 256 | **2.800** | **70.60** | **47.0** | 58.0 | 52.5 |' in report
    assert '| Affine-Scaled (sigmoid) |' in report
    [table] = json.loads((out / 'numbers.json').read_text())['tables']
    methods = table['methods']
    assert table['objective'] == 'KD from out/teacher' and table['loss'] == 'kd_loss'

    assert (methods['Affine-Scaled']['delta_params'] == 2 * 32 * 4
            and methods['Sink']['delta_params'] == 2 * 4)
    assert 'One run per method' in report
    analyze.main(['table', *runs[:2], f'--out_dir={out}', '--metric=acc'])
    assert ('| Baseline | 0 | **2.820** | **71.70** | **45.0** | 60.0 | **52.5** '
            '|' in (out / 'report.md').read_text())


def test_table_job_seeds_give_mean_std_and_a_noise_verdict(tmp_path):
    runs = []
    for seed, (a, b) in enumerate([(0.50, 0.52), (0.52, 0.50), (0.51, 0.51)]):
        runs.append(table_run(tmp_path / f'softmax{seed}', 'softmax', seed, 2.0 + seed / 100,
                              dict(heldout=a)))
        runs.append(table_run(tmp_path / f'affine{seed}', 'affine', seed, 1.0 + seed / 100,
                              dict(heldout=b)))
    out = tmp_path / 'table'
    analyze.main(['table', *runs, f'--out_dir={out}'])
    report = (out / 'report.md').read_text()
    # no c4: the runs' val PPL
    assert '| Method | ΔParams | KD loss | Val PPL | Held-out | Avg. |' in report
    assert ('| Baseline | 0 | 2.010 ± 0.010 | **7.39** ± 0.00 | **51.0** ± 1.0 | **51.0** ± 1.0 |'
            in report)
    assert '| Affine-Scaled | 256 | **1.010** ± 0.010 |' in report
    assert 'Seeds: 0, 1, 2' in report
    assert ('Held-out: Baseline vs Affine-Scaled' in report
            or 'Held-out: Affine-Scaled vs Baseline' in report)
    # 1.0 vs 2.0, std 0.01: far outside noise
    assert 'loss:' not in report.split('Within noise')[1].split('\n')[0]


def test_table_job_bad_input(tmp_path):
    a = table_run(tmp_path / 'a', 'softmax', 0, 2.0, dict(boolq=0.5))
    b = table_run(tmp_path / 'b', 'affine', 0, 2.0, dict(boolq=0.5))
    (tmp_path / 'b' / 'config.json').write_text(json.dumps(dict(attention='affine', n_layer=4,
                                                                n_embd=32)))
    c = table_run(tmp_path / 'c', 'affine', 0, 2.0, dict(boolq=0.5))
    os.remove(os.path.join(c, 'eval.json'))
    out = tmp_path / 'table'
    for runs, message in [([a, b], 'different model sizes'), ([a, c], 'no eval.json; run '
                                                                      'eval_zeroshot.py')]:
        with pytest.raises(RunError, match=message):
            analyze.main(['table', *runs, f'--out_dir={out}'])
        assert not out.exists()


def test_table_job_names_the_run_without_validation(tmp_path):
    """Issue 62: one run of several without a val_ppl (and no c4 in the eval files) gave "neither a
    c4 result in every eval file nor a val_ppl in every run's metrics.jsonl", naming no run. Now
    the one line names that run, and only it; nothing is written."""
    runs = [table_run(tmp_path / name, name, 0, 2.0, dict(boolq=0.5))
            for name in ('softmax', 'affine', 'sink')]
    records = (tmp_path / 'affine' / 'metrics.jsonl').read_text().splitlines()
    (tmp_path / 'affine' / 'metrics.jsonl').write_text(records[0] + '\n')  # no evaluation yet
    out = tmp_path / 'table'
    done = subprocess.run([sys.executable, 'analyze.py', 'table', *runs, f'--out_dir={out}'],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"analyze.py: error: {runs[1]}: no val_ppl in metrics.jsonl (the run never reached an "
        "evaluation); the perplexity column takes every run's last val_ppl, or c4 where every "
        "run's eval.json holds it: train the run to an evaluation (every eval_interval steps, and "
        "at its last), or evaluate c4 for every run (eval_zeroshot.py --tasks=...,c4)"]
    assert not out.exists()


def test_table_job_never_ranks_or_pools_runs_of_other_objectives_or_data(tmp_path):
    """A variant trained with KD and with CE: two tables, each loss column named, bold only against
    its own rows."""
    runs = [table_run(tmp_path / 'kd_softmax', 'softmax', 0, 2.5, dict(boolq=0.6)),
            table_run(tmp_path / 'kd_affine', 'affine', 0, 2.4, dict(boolq=0.5)),
            table_run(tmp_path / 'ce_affine0', 'affine', 0, 3.1, dict(boolq=0.55), teacher=None),
            table_run(tmp_path / 'ce_affine1', 'affine', 1, 3.3, dict(boolq=0.57), teacher=None),
            table_run(tmp_path / 'kd_half', 'affine', 0, 2.0, dict(boolq=0.5), kd_alpha=0.5),
            table_run(tmp_path / 'other_data', 'affine', 0, 1.0, dict(boolq=0.9), teacher=None,
                      data_dir='data/b')]
    out = tmp_path / 'table'
    analyze.main(['table', *runs, f'--out_dir={out}'])
    report = (out / 'report.md').read_text()
    sections = {part.split('\n')[0]: part for part in report.split('## ')[1:]}
    assert list(sections) == ['KD from out/teacher, data data/a', 'CE, data data/a',
                              'KD from out/teacher, kd_alpha=0.5, data data/a', 'CE, data data/b']
    kd = sections['KD from out/teacher, data data/a']
    assert '| Method | ΔParams | KD loss | Val PPL | BoolQ | Avg. |' in kd
    assert '| Baseline | 0 | 2.500 |' in kd and '| Affine-Scaled | 256 | **2.400** |' in kd
    # the two CE seeds pooled with each other only, and ranked against nothing
    ce = sections['CE, data data/a']
    assert '| Method | ΔParams | CE loss | Val PPL | BoolQ | Avg. |' in ce
    assert '| Affine-Scaled | 256 | 3.200 ± 0.141 | 7.39 ± 0.00 | 56.0 ± 1.4 | 56.0 ± 1.4 |' in ce
    assert '| Affine-Scaled | 256 | 1.000 | 7.39 | 90.0 | 90.0 |' in sections['CE, data data/b']
    tables = json.loads((out / 'numbers.json').read_text())['tables']
    assert [(t['objective'], t['data_dir'], t['loss']) for t in tables] == [
        ('KD from out/teacher', 'data/a', 'kd_loss'), ('CE', 'data/a', 'loss'),
        ('KD from out/teacher, kd_alpha=0.5', 'data/a', 'kd_loss'), ('CE', 'data/b', 'loss')]
    assert tables[1]['methods']['Affine-Scaled']['runs'] == runs[2:4]
    labels = [r['label'] for r in analyze.label_runs([analyze.load_run(d) for d in runs[1:4]])]
    assert labels == ['Affine-Scaled [KD from out/teacher]', 'Affine-Scaled [CE] seed '
                                                             '0', 'Affine-Scaled [CE] seed 1']


def test_a_log_with_repeated_steps_is_refused(tmp_path):
    fake_run(tmp_path / 'run', 'softmax', [1.0] * 4)
    log = tmp_path / 'run' / 'metrics.jsonl'
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(''.join(lines[:3] + lines[1:2] + lines[3:]))  # step 2 again, on line 4
    out = tmp_path / 'report'
    with pytest.raises(RunError, match=r'step 2 is on lines 2 and 4: two train.py wrote this log '
                                       r'at once') as e:
        analyze.main(['runs', str(tmp_path / 'run'), f'--out_dir={out}', '--window=0,2'])
    assert str(e.value).startswith(f"{log}: ") and '\n' not in str(e.value) and not out.exists()


# -----------------------------------------------------------------------------
# What a short, odd or unreachable held-out text allows (issue 43)


def short_text_report(tmp_path, spec, text, *args):
    """analyze.py attention on `text` (in bytes tokens, one a byte): the one model's numbers, and
    report.md."""
    (tmp_path / 'short.txt').write_text(text)
    out = tmp_path / 'report'
    analyze.main(['attention', spec, f'--out_dir={out}', f'--data={tmp_path / "short.txt"}', *args])
    [stats] = json.loads((out / 'numbers.json').read_text())['models'].values()
    assert (
        out / 'fig4_first_token.png').stat().st_size > 1000 and (out / 'fig_knockout.png').is_file()
    return stats, (out / 'report.md').read_text()


def test_attention_job_takes_what_a_short_text_has(tmp_path):
    """Before, a text with no window beyond the analysed ones was refused ("has 0 windows of 32
    tokens, fewer than --calibration=4"), and so was one with fewer than --num_seqs; now the figures
    are drawn from what it has, and W8A8's ranges and Gu et al.'s setting take fewer windows, or
    none, said in the report."""
    # block_size 32: Gu et al.'s windows are 32 long
    spec = save_checkpoint(tmp_path / 'sink', tiny_model('sink'))
    # 6 windows: 4 read, 2 left
    stats, report = short_text_report(tmp_path, spec, TEXT[:6 * 32], '--num_seqs=4')
    assert (stats['num_seqs'] == 4 and stats['w8a8']['calibration'] == 2
            and stats['gu']['samples'] == 6)
    assert set(stats['notes']) == {'w8a8', 'gu'}
    assert ('- Sink: W8A8: ranges fixed on 2 windows of 32 tokens, fewer than --calibration=4: '
            f'{tmp_path / "short.txt"} (192 tokens) has no more beyond the analysed') in report
    assert ("- Sink: Gu et al.'s setting: 6 windows of 32 tokens, fewer than --sink_samples=100"
            in report)
    # 2 windows: both read
    stats, report = short_text_report(tmp_path, spec, TEXT[:2 * 32 + 10], '--num_seqs=4')
    assert stats['num_seqs'] == 2 and stats['w8a8'] is None and stats['gu']['samples'] == 2
    assert ('Held-out text: 2 sequences of 32 tokens' in report
            and '| Sink | - | - | - | - |' in report)
    assert ('- Sink: analysed: 2 windows of 32 tokens, fewer than --num_seqs=4: '
            f'{tmp_path / "short.txt"} (74 tokens) has no more') in report
    assert ('- Sink: W8A8: skipped: ' in report and 'has 2 windows of 32 tokens, all analysed, and '
                                                    'W8A8 fixes its ranges on others '
                                                    '(--calibration=4)' in report)
    enc = load_tokenizer('bytes')
    seqs = analyze.heldout_sequences(str(tmp_path / 'short.txt'), enc,
                                     tokenizer_info(enc, 'bytes')['sha256'], 2, 32)
    assert stats['knockout'] == pytest.approx(sink_costs.knockout_losses(tiny_model('sink'), seqs))


def test_attention_job_on_a_run_whose_val_split_is_short(tmp_path):
    """A prepared directory whose val split holds fewer than 65 tokens: data.Windows refuses windows
    of 64, which Gu et al.'s setting asked for, and that stopped the job ("the val split has fewer
    than block_size + 1 = 65 tokens"); now Gu et al.'s setting is skipped, with a line in the
    report, and the rest is measured."""
    torch.manual_seed(0)
    spec = save_checkpoint(tmp_path / 'model',
                           GPT(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                                           intermediate_size=64, vocab_size=300, block_size=64)))
    (tmp_path / 'lines.txt').write_text(''.join(f'line {i} of the corpus, '
                                                f'{i * 7}\n' for i in range(8)))
    prepare_data.main([f'--source={tmp_path / "lines.txt"}', '--tokenizer=bytes',
                       f'--out_dir={tmp_path / "data"}',
                       # val: lines 0 and 4
                       '--txt_sample_by=line', '--val_every=4', '--num_proc=1'])
    out = tmp_path / 'report'
    analyze.main(['attention', spec, f'--out_dir={out}', f'--data={tmp_path / "data"}',
                  '--seq_len=16', '--num_seqs=2'])
    [stats] = json.loads((out / 'numbers.json').read_text())['models'].values()
    assert stats['gu'] is None and stats['num_seqs'] == 2 and set(stats['notes']) == {'gu', 'w8a8'}
    assert stats['w8a8']['calibration'] == 1  # the split's third window of 16 (+1) tokens
    report = (out / 'report.md').read_text()
    assert (f"- Baseline: Gu et al.'s setting: skipped: {tmp_path / 'data'}'s val split "
            "has no window of 64 tokens" in report)
    # "their setting": -
    assert re.search(r'\n\| Baseline \| [\d.]+ \| - \| - \| - \| [\d.]+ \|\n', report)


@pytest.mark.parametrize('content,message', [
    (b'', r'--data=\S+: empty \(0 bytes\); give a file that holds held-out text$'),
    (b'too short', r'\(9 tokens\) has no window of 32 tokens; give a longer text, or a lower '
                   r'--seq_len$'),
    ('Caf\u00e9 '
     'cr\u00e8me\n'.encode('latin-1') * 40, r'--data=\S+: not UTF-8 text: byte 0xe9 at offset 3 '
                                            r'\(line 1\); '
                                                       r'convert a Latin-1 text with iconv -f '
                                                       r'latin1 -t utf-8 '),
    (b'\x00\x01' * 40 + b'\n\xff\xfe' + bytes(range(256)), r'byte 0xff at offset 81 \(line 2\).*a '
                                                           r'binary file'),
], ids=['empty', 'shorter-than-a-window', 'latin-1', 'binary'])
def test_attention_job_refuses_a_text_in_one_line(tmp_path, content, message):
    """An empty text, one shorter than a window, a Latin-1 text and a binary file: one line each
    (before: a text with no window was said to have fewer than --num_seqs, a Latin-1 or binary one
    gave a UnicodeDecodeError)."""
    spec = save_checkpoint(tmp_path / 'softmax', tiny_model('softmax'))
    (tmp_path / 'text.txt').write_bytes(content)
    out = tmp_path / 'report'
    with pytest.raises(RunError, match=message) as e:
        analyze.main(['attention', spec, f'--out_dir={out}', f'--data={tmp_path / "text.txt"}'])
    assert '\n' not in str(e.value) and not out.exists()


def test_attention_job_offline_refuses_c4_before_datasets_retries(tmp_path, monkeypatch):
    """--data=c4 (the default) where the hub cannot be reached: before, datasets retried for 26 s,
    then said to export C4; now one connection attempt decides, and the command fails in one line
    that gives the commands for local text. The line names the hub's address, which only that
    attempt (lmkit.zeroshot.hub_unreachable) knows, not datasets' error; the machine's speed is
    no part of the test."""
    unreachable_hub(monkeypatch)
    spec = save_checkpoint(tmp_path / 'affine', tiny_model('affine'))
    out = tmp_path / 'report'
    run = subprocess.run([sys.executable, 'analyze.py', 'attention', spec, f'--out_dir={out}'],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and not out.exists()
    [line] = run.stderr.splitlines()
    assert line.startswith('analyze.py: error: --data=c4 reads C4 validation from the hub, and the '
                           'Hugging Face hub (127.0.0.1:') and 'cannot be reached' in line
    assert ('python prepare_data.py --source=builtin --tokenizer=bytes --val_every=10 '
            '--out_dir=data/heldout, then --data=data/heldout' in line)
    # offline C4 as eval_zeroshot.py --export_data writes it
    data = write_task_data(tmp_path / 'evaldata')
    analyze.main(['attention', spec, f'--out_dir={out}', f'--data_dir={data}', '--num_seqs=2',
                  '--sink_samples=2', '--calibration=1'])
    assert json.loads((out / 'numbers.json').read_text())['data'] == 'c4'
