"""Smoke tests for tools/bench.py: every section at tiny sizes, run as the README runs it (python -m
tools.bench, one process); the output must be one well-formed Markdown table per section with every
row present and finite ratios. Timings are never checked against a threshold."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools import bench
from tools import gpu_check
from lmkit import zeroshot

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]
# big enough that every step allocates MiBs (the CPU peak is read from resident pages), small enough
# for seconds
TINY = ['--device=cpu', '--n_layer=1', '--n_embd=128', '--n_head=2', '--n_kv_head=1',
        '--vocab_size=512',
        '--seq_lens=256,512', '--steps=1', '--kd_tokens=256', '--kd_vocab=2000', '--kd_hidden=32',
        '--variants=softmax,affine', '--train_steps=1', '--train_batch_size=2',
        '--train_seq_len=64',
        '--eval_docs=3', '--eval_batch_size=4', '--sections=attention,kd,train,eval,harness']
TITLES = {'attention': 'Attention variants', 'kd': 'KD loss', 'train': 'Training throughput',
          'eval': 'Zero-shot evaluation', 'study': "The sink study's runs",
          'processes': 'Processes',
          'probes': 'What the sink measures cost', 'batched': 'Seeds batched into one model'}


def tables(stdout):
    """{section: list of rows as {column: cell}} for each '## title' section of tools/bench.py's
    output, checking that each is a well-formed Markdown table: header, separator, rows with as many
    cells as the header."""
    result = {}
    for block in stdout.split('\n## ')[1:]:
        title, lines = block.splitlines()[0], [line for line in block.splitlines()
                                               if line.startswith('|')]
        header = [cell.strip() for cell in lines[0].strip('|').split('|')]
        assert lines[1] == '|' + '---|' * len(header), title
        rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]
        assert rows and all(len(row) == len(header) for row in rows), title
        section = next(key for key, prefix in TITLES.items() if title.startswith(prefix))
        result[section] = [dict(zip(header, row)) for row in rows]
    return result


def finite(cell):
    return math.isfinite(float(cell.rstrip('%').replace(',', '')))


@pytest.fixture(scope='module')
def output():
    run = subprocess.run([sys.executable, '-m', 'tools.bench', *TINY], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith('# tools/bench.py on '
                                 'CPU') and 'float32' in run.stdout.splitlines()[0]
    return tables(run.stdout)


@pytest.mark.xdist_group('bench_output')  # its module fixture, built once
def test_every_section_prints_one_table(output):
    assert list(output) == ['attention', 'kd', 'train', 'eval']


@pytest.mark.xdist_group('bench_output')  # its module fixture, built once
def test_attention_table(output):
    rows = output['attention']
    assert [(r['variant'], r['T']) for r in rows] == [(v, T) for T in ('256', '512')
                                                      for v in (*bench.ATTENTIONS, bench.EXPLICIT)]
    for r in rows:
        assert all(finite(r[key])
                   for key in ('fwd+bwd (ms)', 'time / softmax', 'peak mem (MiB)', 'mem / softmax'))
        if r['variant'] == 'softmax':
            assert r['time / softmax'] == r['mem / softmax'] == '1.00'


@pytest.mark.xdist_group('bench_output')  # its module fixture, built once
def test_kd_table(output):
    rows = output['kd']
    assert [r['path'] for r in rows] == ['naive', 'fused_kd_loss']
    assert all(finite(r[key]) for r in rows
               for key in ('time (s)', 'time / naive', 'peak mem (MiB)',
                           'mem / naive'))
    assert float(rows[0]['loss']) == pytest.approx(float(rows[1]['loss']), rel=1e-4)


@pytest.mark.xdist_group('bench_output')  # its module fixture, built once
def test_train_table(output):
    rows = output['train']
    assert [r['variant'] for r in rows] == ['softmax', 'affine']
    assert all(finite(r[key]) and float(r[key].rstrip('%').replace(',', '')) > 0
               for r in rows for key in ('step (ms)', 'tokens/s', 'MFU'))


@pytest.mark.xdist_group('bench_output')  # its module fixture, built once
def test_eval_table(output):
    rows = output['eval']
    assert [r['variant'] for r in rows] == ['softmax', 'affine']
    for r in rows:
        assert (r['docs'], r['requests']) == ('3', '12')
    # softmax: each context once, fewer tokens than every request whole (one by one); affine with N
    # = the call's length (seq_len) cannot use a KV cache: every request whole, padded
    tokens = [int(r['tokens '
                    f'({kind})'].replace(',', '')) for r in rows
              for kind in ('batched', 'one by one')]
    assert tokens[0] < tokens[1] == tokens[3] <= tokens[2]
    for r in rows:
        assert all(finite(r[key]) for key in ('batched docs/s', 'one-by-one docs/s', 'speedup'))
        assert float(r['max abs loglik diff']) < 1e-3  # both scorers score the same requests


def test_study_runs_read_each_runs_own_record(data_dir, tmp_path):
    """bench.study_runs: the study's train.py command, run for real (eager here: compiling would
    take a minute), its tokens/s read back from its metrics.jsonl and its seconds outside the steps
    from its wall time."""
    out = str(tmp_path / 'run')
    command = bench.study_command('softmax', 6, False, data_dir, out, 'cpu') + ['--eval_batches=1']
    (tokens_per_sec, outside), = bench.study_runs([command], threads=1)
    records = [json.loads(line) for line in open(f'{out}/metrics.jsonl')]
    steps = [r for r in records if 'tokens_per_sec' in r]
    assert [r['step'] for r in steps] == [1, 2, 3, 4, 5,
                                          6] and tokens_per_sec == steps[-1]['tokens_per_sec']
    # the study's 8 evaluations, here every step
    assert sum(1 for r in records if 'first_token_weight' in r) == 6
    assert 0 < outside and 'step 6/6' in open(f'{out}.log').read()


def test_study_section_table(monkeypatch, capsys):
    """--sections=study: its two tables from the runs' numbers (stand-ins here: the runs are the
    test above's), the plain loop measured for real."""
    runs = []

    def fake_runs(commands, threads):
        runs.append(([c[c.index('--compile=True') if '--compile=True' in c
                        else c.index('--compile=False')]
                      for c in commands], threads))
        return [(1000.0 * (len(runs) + i), 20.0 + i) for i in range(len(commands))]
    monkeypatch.setattr(bench, 'study_runs', fake_runs)
    args = bench.parse_args(['--device=cpu', '--sections=study', '--variants=softmax',
                             '--study_steps=6'])
    bench.bench_study(args, torch.device('cpu'))
    assert runs == [(['--compile=False'], 1), (['--compile=True'], 1), (['--compile=True'] * 2, 1),
                    (['--compile=True'], 2),
                    (['--compile=True'] * 2, 1)] + [(['--compile=True'], 1)] * 3
    out = capsys.readouterr().out
    (study,), processes = tables(out)['study'], tables(out)['processes']
    assert (study['variant'], study['train.py eager'], study['train.py compiled']) == ('softmax',
                                                                                       '1,000',
                                                                              '2,000')
    plain = float(study['plain loop tokens/s'].replace(',', ''))  # shown rounded to a whole token/s
    assert abs(float(study['compiled / plain']) - 2000 / plain) <= 0.005 + 2000 / plain ** 2
    assert study['outside the steps (s)'] == '20'
    assert study['a 1,465-step run (min)'] == f'{(20 + 1465 * 2048 / 2000) / 60:.1f}'
    assert processes == [{'processes x threads': '2 x 1', 'tokens/s per run': '3,000 / 4,000',
                          'tokens/s in all': '7,000'},
                         {'processes x threads': '1 x 2', 'tokens/s per run': '4,000',
                          'tokens/s in all': '4,000'}]
    assert 'cost 1.0 s of a run\'s 21 s outside its steps' in out
    assert [(r['batch (windows)'], r['tokens/s'], r["over the study's batch"])
            for r in tables(out)['batched']] == [
        # the 6th-8th stand-in runs
        ('16', '6,000', '1.00'), ('32', '7,000', '1.17'), ('64', '8,000', '1.33')]


def test_kd_skips_the_naive_path_when_it_cannot_fit(monkeypatch, capsys):
    monkeypatch.setattr(bench, 'available_memory', lambda device: 2**20)
    args = bench.parse_args(['--device=cpu', '--kd_tokens=64', '--kd_vocab=1000', '--kd_hidden=16'])
    bench.bench_kd(args, torch.device('cpu'))
    out, err = capsys.readouterr()
    rows = tables(out)['kd']
    assert ([r['path'] for r in rows] == ['naive', 'fused_kd_loss']
            and rows[0]['time (s)'].startswith('skipped'))
    estimate = 5 * 64 * 1000 * 4
    assert (f'~{estimate / 2**20:.1f} (estimate)' in rows[0]['peak mem (MiB)'] and 'naive '
                                                                                   'skipped' in err)
    assert finite(rows[1]['time (s)']) and rows[1]['time / naive'] == '-'


def test_probes_section_table(monkeypatch, capsys):
    """--sections=probes: one row per variant, each measure run once (the timings are not
    asserted)."""
    def once(fn, repeats=3):  # every measure runs, a second each
        fn()
        return 1.0
    monkeypatch.setattr(bench, 'seconds', once)
    args = bench.parse_args(['--device=cpu', '--sections=probes', '--variants=softmax,affine'])
    bench.bench_probes(args, torch.device('cpu'))
    rows = tables(capsys.readouterr().out)['probes']
    assert [r['variant'] for r in rows] == ['softmax', 'affine'] and all(r['share'] == '100%'
                                                                         for r in rows)


def test_bad_arguments(capsys):
    for argv, message in [(['--sections=attention,bogus'],
                           'unknown bogus; choose from attention, kd, train, eval'),
                          (['--variants=flash'], 'unknown flash; choose from softmax')]:
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_check_hands_over_to_gpu_check(monkeypatch):
    """python -m tools.bench --check becomes python -m tools.gpu_check (os.execv: its output and
    exit status are the check's, as tests/test_faults.py sees), with the check's flags in whatever
    form they were given, --steps and --kd_tokens; tools/gpu_check.py reads them back as they
    were."""
    class Executed(Exception):
        pass

    def execv(path, argv):
        raise Executed(path, argv)
    monkeypatch.setattr(bench.os, 'execv', execv)
    with pytest.raises(Executed) as e:
        bench.main(['--check', '--check_parts', 'torchrun,kernels', '--check_json=out/check.json',
                    '--steps=3', '--sections=kd'])
    path, argv = e.value.args
    assert path == argv[0] == sys.executable and argv[1:3] == ['-m', 'tools.gpu_check']
    assert argv[3:] == ['--check_json=out/check.json', '--check_parts=torchrun,kernels',
                        '--steps=3', '--kd_tokens=8192']
    args = gpu_check.parse_args(argv[3:])
    assert (args.check_json, args.check_parts, args.check_batch_size, args.steps,
            args.kd_tokens) == (
        'out/check.json', ['torchrun', 'kernels'], 4, 3, 8192)
    with pytest.raises(Executed) as e:
        bench.main(['--check=True', '--check_batch_size', '2'])
    assert e.value.args[1][3:] == ['--check_batch_size=2', '--steps=7', '--kd_tokens=8192']


def test_the_six_tasks_offline_for_both_harnesses(tmp_path):
    """tools/harness_tasks.py: rows in each task's hub schema that eval_zeroshot's builders read
    (the same every time), a YAML per task for lm_eval --include_path that reads the same file;
    bench.harness_samples reads lm_eval's --output_path as 0.4.9 writes it (log-likelihoods as
    strings)."""
    from tools import harness_tasks
    paths = harness_tasks.write_tasks(str(tmp_path / 'data'), 5)
    assert (harness_tasks.write_tasks(str(tmp_path / 'again'), 5)
            and all(Path(path).read_text()
                    == (tmp_path / 'again' / Path(path).relative_to(tmp_path / 'data')).read_text()
                    for path in paths.values()))
    for task in paths:
        docs = zeroshot.build_docs(task, *zeroshot.read_rows(task, str(tmp_path / 'data')))
        assert len(docs) == 5 and {len(d.requests) for d in docs} == {4
                                                                      if task in ('arc_easy',
                                                                                  'arc_challenge',
                                                                                  'hellaswag')
                                                                      else 2}
    names = harness_tasks.write_harness_yamls(str(tmp_path / 'yaml'), '/env/lm_eval/tasks', paths)
    assert names == [f'bench_{task}' for task in harness_tasks.SIX_TASKS]
    yaml = (tmp_path / 'yaml' / 'bench_arc_challenge.yaml').read_text()
    assert yaml.splitlines()[0] == 'include: /env/lm_eval/tasks/arc/arc_challenge.yaml'
    assert (f"test: {paths['arc_challenge']}" in yaml and 'test_split: test' in yaml
            and 'validation_split: null' in yaml)
    out = tmp_path / 'theirs' / 'model'
    out.mkdir(parents=True)
    (out / 'samples_bench_piqa_2026.jsonl').write_text(json.dumps(dict(doc_id=1, filtered_resps=[
        ['-1.5', 'False'], ['-0.25', 'True']])) + '\n')
    (out / 'results_2026.json').write_text(json.dumps(dict(results=dict(bench_piqa={
        'alias': 'bench_piqa', 'acc,none': 0.5, 'acc_stderr,none': 0.1, 'acc_norm,none': 1.0}))))
    assert bench.harness_samples(str(tmp_path / 'theirs'), 'bench_piqa') == ({1: [-1.5, -0.25]},
                                                                            dict(acc=0.5,
                                                                                 acc_norm=1.0))
