"""analyze.py's statistics against direct computations from an explicit attention matrix built here."""
import json
import math

import numpy as np
import pytest
import torch

import analyze
from model import GPT, ModelConfig, rope_cos_sin


@torch.no_grad()
def explicit_weights(model, idx):
    """Every layer's effective weights, built here from the paper's equations with the model's parameters."""
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
        e = torch.where(visible, torch.exp(q @ k.transpose(-2, -1) / math.sqrt(cfg.head_dim)), torch.zeros(()))
        denominator = e.sum(-1, keepdim=True)
        if cfg.attention == 'sink':
            denominator = denominator + a.sinks.double().exp().view(1, -1, 1, 1)
        w = e / denominator
        if cfg.attention == 'affine':
            alpha = (0.1 * (h @ a.alpha_proj.weight.double().T) + 0.5).clamp(0, 1).transpose(1, 2)[..., None]
            w = alpha * w + (a.alpha_ma.double().view(1, -1, 1, 1) - alpha) / T * visible
        out.append(w)
        x = layer(x, cos, sin, positions)
    return out


@pytest.mark.parametrize('attention', ['softmax', 'sink', 'affine'])
def test_attention_statistics_match_the_explicit_matrix(attention):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64, vocab_size=50,
                            block_size=32, attention=attention, init_std=0.3)).double()
    for m in model.modules():
        if hasattr(m, 'alpha_ma'):
            m.alpha_ma.uniform_(0.2, 0.8)
    idx = torch.randint(0, 50, (3, 16))
    stats = analyze.attention_statistics(model, idx, corner=5)
    for s, w in zip(stats, explicit_weights(model, idx)):
        assert s['first_token'] == pytest.approx(w[:, :, 1:, 0].mean().item(), rel=1e-9)
        assert s['row_sums'] == pytest.approx(w.sum(-1).mean(1).flatten().tolist(), rel=1e-9)
        assert s['head_total'] == pytest.approx(w.sum(-1).mean(dim=(0, 2)).tolist(), rel=1e-9)
        entropies = []  # written out entry by entry
        for b in range(3):
            for h in range(4):
                for i in range(1, 16):
                    p = w[b, h, i, :i + 1].abs()
                    p = p / p.sum()
                    entropies.append(-(p * p.log()).sum().item())
        assert s['entropy'] == pytest.approx(np.mean(entropies), rel=1e-9)
        assert np.allclose(s['corner'], w[0, :, :5, :5].mean(0).numpy())
        if attention == 'softmax':
            assert s['row_sums'] == pytest.approx([1.0] * 48)
        if attention == 'sink':
            assert max(s['row_sums']) < 1 and 'sinks' in s
        if attention == 'affine':
            assert min(s['row_sums']) != max(s['row_sums']) and len(s['alpha']) == 4


def test_grad_norm_statistics_and_spikes_on_a_known_series():
    rng = np.random.default_rng(0)
    g = 1.0 + 0.01 * rng.standard_normal(600)
    g[[10, 200, 450]] = [5.0, 3.0, 1.2]  # two clear spikes and one small bump
    median = np.median(g[:500])
    mad = np.median(np.abs(g[:500] - median))
    assert 1.2 > median + 9 * mad  # the bump is itself over the k = 9 threshold of this very quiet series
    counts = analyze.spike_counts(g, ks=(6, 9))
    assert counts == {6: 3, 9: 3}
    counts = analyze.spike_counts(g, ks=(6, 9), start=100, end=300)
    assert counts == {6: 1, 9: 1}
    s = analyze.grad_norm_statistics(g, 0, 500)
    assert s['mean'] == pytest.approx(g[:500].mean()) and s['variance'] == pytest.approx(g[:500].var())
    assert s['cv'] == pytest.approx(g[:500].std() / g[:500].mean())
    with pytest.raises(ValueError, match='only 600 steps'):
        analyze.spike_counts(g, end=700)


def fake_run(path, attention, grad_norms, n_layer=2, kd=False):
    path.mkdir(parents=True)
    (path / 'config.json').write_text(json.dumps(dict(attention=attention, n_layer=n_layer, n_embd=32)))
    with open(path / 'metrics.jsonl', 'w') as f:
        for step, g in enumerate(grad_norms, 1):
            record = dict(step=step, loss=3.0 - step / 1000, grad_norm=g, lr=1e-3)
            if kd:
                record['kd_loss'] = 1.0 - step / 2000
            if step % 100 == 0:
                record['attn_logit_mean'] = -step / 1000
            f.write(json.dumps(record) + '\n')


def test_runs_report_writes_tables_figures_and_numbers(tmp_path):
    quiet = [1.0 + 0.001 * (i % 7) for i in range(600)]
    spiky = list(quiet)
    spiky[50] = spiky[300] = 10.0
    fake_run(tmp_path / 'softmax', 'softmax', spiky, kd=True)
    fake_run(tmp_path / 'affine', 'affine', quiet, kd=True)
    out = tmp_path / 'report'
    analyze.main(['runs', str(tmp_path / 'softmax'), str(tmp_path / 'affine'), f'--out_dir={out}', '--late=100'])
    numbers = json.loads((out / 'numbers.json').read_text())['runs']
    softmax = numbers[str(tmp_path / 'softmax')]
    assert softmax['spikes'] == {'6': 2, '9': 2} and numbers[str(tmp_path / 'affine')]['spikes'] == {'6': 0, '9': 0}
    assert softmax['grad_norm']['mean'] == pytest.approx(np.mean(spiky[:500]))
    assert softmax['final_loss'] == pytest.approx(1.0 - 600 / 2000)  # the KD loss when every run logs it
    report = (out / 'report.md').read_text()
    assert '| softmax | 2 | 2 |' in report and '| affine | 0 | 0 |' in report
    for name in ('fig2_attn_logit.png', 'fig7_loss.png', 'fig8_grad_norm.png', 'fig10_loss_late.png'):
        assert (out / name).stat().st_size > 1000 and f'({name})' in report


def test_runs_report_bad_input_leaves_no_report(tmp_path):
    fake_run(tmp_path / 'a', 'softmax', [1.0] * 100)
    fake_run(tmp_path / 'b', 'affine', [1.0] * 600, n_layer=4)
    fake_run(tmp_path / 'c', 'affine', [1.0] * 600)
    (tmp_path / 'empty').mkdir()
    out = tmp_path / 'report'
    for dirs, message in [(['a', 'c'], 'asked for steps 0-500, but the run has only 100 steps'),
                          (['b', 'c'], 'different model sizes'),
                          (['empty'], 'no metrics.jsonl')]:
        with pytest.raises(SystemExit, match=message):
            analyze.main(['runs', *(str(tmp_path / d) for d in dirs), f'--out_dir={out}'])
        assert not out.exists()
