"""The sink study's records (study/study_records.py) and the commands around them: a file in runs/
that is not a valid record, or a record made with other settings, stops the study with one line
instead of changing a verdict; one writer per run; SIGTERM and SIGINT stop the children cleanly and
a re-run continues. The committed v1 records pass unchanged. The study cases share one tiny study,
trained once (study)."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import prepare_data
from study import sink_study
from study import study_records
from lmkit.errors import RunError
from lmkit.runs import run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, 'docs', 'sink_study')
TINY = ['--variants=softmax', '--arms=ce,kd', '--seeds=1', '--kd_seeds=1', '--teachers=1',
        '--tokens=2048', '--block_size=32', '--compile=False', '--eval_batches=2', '--jobs=1']


@pytest.fixture(scope='module')
def stdlib_dir(tmp_path_factory):
    """A small corpus of the standard library (the source v1's records were trained on)."""
    out = str(tmp_path_factory.mktemp('stdlib') / 'stdlib_bytes')
    prepare_data.main(['--source=stdlib', '--tokenizer=bytes', f'--out_dir={out}', '--val_every=50',
                       '--num_proc=1', '--max_tokens=60000'])
    return out


@pytest.fixture(scope='module')
def study(tmp_path_factory, study_data):
    """A tiny study, trained once: ce_softmax_s1 (the teacher) and kd_softmax_s1. Returns (its dir,
    argv)."""
    out = tmp_path_factory.mktemp('study') / 'tiny'
    argv = [f'--out_dir={out}', f'--data_dir={study_data}', *TINY]
    sink_study.main(argv)
    return out, argv


def copy_of(study, tmp_path):
    """A copy of the tiny study to change, and its argv."""
    out, argv = study
    shutil.copytree(out, tmp_path / 'copy')
    return tmp_path / 'copy', [a.replace(str(out), str(tmp_path / 'copy')) for a in argv]


@pytest.fixture
def v1(tmp_path):
    """A copy of the committed study's records, to change: (its report_dir, the argv of its
    report)."""
    report = tmp_path / 'v1'
    shutil.copytree(os.path.join(COMMITTED, 'runs'), report / 'runs')
    return report


def report_argv(report, stdlib_dir, tmp_path):
    return ['--plan=full', f'--report_dir={report}', f'--out_dir={tmp_path / "out"}',
            f'--data_dir={stdlib_dir}', '--report_only=True']


def edit(path, change):
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def test_the_committed_records_pass_and_their_verdicts_regenerate(v1, stdlib_dir, tmp_path):
    """Every committed record (the full study's and the pilot's) passes unchanged; the report
    regenerates from them with the committed verdicts, and its Machine line names the machine that
    trained them."""
    for folder in (os.path.join(COMMITTED, 'runs'), os.path.join(COMMITTED, 'pilot', 'runs')):
        assert len(study_records.read_records(folder)) == len(os.listdir(folder)) > 20
    results = sink_study.main(report_argv(v1, stdlib_dir, tmp_path))
    with open(os.path.join(COMMITTED, 'results.json')) as f:
        committed = json.load(f)
    assert [(c['id'], c['verdict'], c['p']) for c in results['claims']] == [
        (c['id'], c['verdict'], c['p']) for c in committed['claims']]
    machines = {json.loads(p.read_text())['machine'] for p in (v1 / 'runs').iterdir()}
    assert results['machine'] == f"{machines.pop()} (79 runs)" and not machines


@pytest.mark.parametrize('case',
                         ['stale copy', 'renamed', 'renamed, name edited', 'weight -5', 'NaN',
                          'teacher edited', 'no_decay edited', 'truncated', 'empty', 'not UTF-8',
                          'an array', 'a string', 'a folder'])
def test_a_file_that_is_not_a_valid_record_stops_the_study(case, v1, stdlib_dir, tmp_path):
    """Each of these changed the kd arm's verdicts in silence, or stopped the study with a traceback
    that named no file: now one line names the file, what is wrong, and where to move it."""
    runs = v1 / 'runs'
    source = runs / 'kd_affine_s1.json'
    target = {'stale copy': 'kd_affine_s1_old.json', 'renamed': 'kd_affine_s9.json',
              'renamed, name edited': 'kd_affine_s9.json'}.get(case, 'kd_affine_s1.json')
    if target != source.name:
        shutil.copy(source, runs / target)
    changes = {
        'stale copy': lambda r: r.update(first_token_weight=[0.001] * 4),
        'renamed, name edited': lambda r: r.update(name='kd_affine_s9'),
        'weight -5': lambda r: r.update(first_token_weight=[-5.0, 0.01, 0.01, 0.01]),
        'NaN': lambda r: r['end']['gu'].update(sink_rate=math.nan),
        'teacher edited': lambda r: r.update(teacher='ce_sink_s1'),
        'no_decay edited': lambda r: r.update(no_decay=['alpha_proj']),
    }
    if case in changes:
        edit(runs / target, changes[case])
    raw = {'truncated': source.read_bytes()[:500], 'empty': b'',
           'not UTF-8': b'{"name": "caf\xe9"}',
           'an array': b'[1, 2]', 'a string': b'"kd_affine_s1"'}
    if case in raw:
        (runs / target).write_bytes(raw[case])
    if case == 'a folder':
        (runs / 'notes').mkdir()
        target = 'notes'
    expected = {'stale copy': 'whose file is kd_affine_s1.json',
                'renamed': 'whose file is kd_affine_s1.json',
                'renamed, name edited': r'name is "kd_affine_s9", but its arm, variant and seed '
                                        r'make it kd_affine_s1',
                'weight -5': r'first_token_weight\[0\] is -5.0, outside its range',
                'NaN': 'end.gu.sink_rate is nan',
                'teacher edited': r'teacher is "ce_sink_s1"', 'no_decay edited': 'no_decay is',
                'truncated': 'not JSON', 'empty': 'not JSON', 'not UTF-8': 'is not UTF-8',
                'an array': 'holds a JSON list', 'a string': 'holds a JSON str',
                'a folder': 'a directory'}[case]
    with pytest.raises(RunError, match=expected) as e:
        sink_study.main(report_argv(v1, stdlib_dir, tmp_path))
    assert str(runs / target) in str(e.value) and 'move it out of runs/' in str(e.value)
    assert '\n' not in str(e.value)
    assert not (v1 / 'results.json').exists()  # nothing written


def test_an_edited_teacher_that_is_still_a_teacher_is_refused(v1, stdlib_dir, tmp_path):
    """kd student seed 1 distils from the first teacher (ce_softmax_s1); a record naming the other
    one is not this command's run: the report refuses it, naming the setting, rather than counting
    it."""
    edit(v1 / 'runs' / 'kd_affine_s1.json', lambda r: r.update(teacher='ce_softmax_s2'))
    with pytest.raises(RunError, match=r"kd_affine_s1 \(other settings: teacher ce_softmax_s2 -> "
                                       r"ce_softmax_s1\)"):
        sink_study.main(report_argv(v1, stdlib_dir, tmp_path))


def test_report_only_with_a_changed_key_refuses_instead_of_an_empty_report(v1, stdlib_dir,
                                                                           tmp_path):
    """A typo in a recipe flag once rewrote the report with 0 records and exit status 0; now it
    lists the records and the key, and writes nothing. --subset=True reports on what is left,
    listing the others."""
    argv = report_argv(v1, stdlib_dir, tmp_path)
    for flag, key in (('--learning_rate=1e-3', 'learning_rate 0.005 -> 0.001'),
                      ('--init_std=0.5', 'init_std (a v1 record holds only the recipe)')):
        with pytest.raises(RunError, match=r"holds 79 record\(s\) this command would leave out .*"
                           + re.escape(key)):
            sink_study.main(argv + [flag])
        assert not (v1 / 'results.json').exists()
    results = sink_study.main(argv + ['--learning_rate=1e-3', '--subset=True'])
    assert results['runs'] == [] and len(results['excluded']) == 79


def test_a_v1_record_stands_only_on_the_standard_library(v1, data_dir, tmp_path):
    """The committed records hold no corpus checksum; they were trained on the standard library, and
    a study on another corpus does not report them as its own."""
    argv = ['--plan=full', f'--report_dir={v1}', f'--out_dir={tmp_path / "out"}',
            f'--data_dir={data_dir}', '--report_only=True']
    with pytest.raises(RunError, match=r"the corpus \(a v1 record trained on the standard library, "
                                       r"this one is " r"builtin\)"):
        sink_study.main(argv)


@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_new_record_knows_what_produced_it(study):
    """Every train.py setting of the run, the corpus's checksums, the commit and whether the tree
    was dirty, the start and end times, and a digest that an edit breaks."""
    out, _ = study
    record = json.loads((out / 'runs' / 'kd_softmax_s1.json').read_text())
    config = json.loads((out / 'train' / 'kd_softmax_s1' / 'config.json').read_text())
    assert record['settings'] == config and record['settings']['seed'] == 1
    meta = json.loads(open(os.path.join(config['data_dir'], 'meta.json')).read())
    assert record['corpus']['checksums'] == meta['checksums']
    git = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    assert record['commit'] == (git.stdout.strip() if git.returncode == 0 else None)
    assert record['dirty'] in (True, False, None)
    assert record['started'] < record['finished'] and record['finished'].endswith('+00:00')
    assert (record['digest'] == study_records.digest(record)
            and record['digest'].startswith('sha256:'))


@pytest.mark.parametrize('case, expected', [
    ('a negative ratio', r'end\.payoff\.ratio_w8a4 is -0\.5, outside its range'),
    ('a layer short', r'end\.payoff\.ffn_kurtosis is not a list of 4 layers'),
    ('a NaN', r'end\.payoff\.residual_max_abs\[2\] is nan, not a finite number'),
    ('a key missing', r'end\.payoff lacks ratio_w4a8'),
    ('a key unknown', r'end\.payoff\.ratio_w2a2 is not a field of a record'),
    ('not an object', r'end\.payoff is \[1\.0\], not an object'),
])
@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_malformed_payoff_is_refused_and_a_record_without_one_passes(case, expected, study,
                                                                       tmp_path):
    """end.payoff (the candidates for v3's payoff measure) is checked as every measure is, one line
    naming the file, digest or not; records from before it (v1's, v2's) have none and pass, and so
    does a new one with it removed."""
    out, argv = copy_of(study, tmp_path)
    path = out / 'runs' / 'kd_softmax_s1.json'
    record = json.loads(path.read_text())
    payoff = record['end']['payoff']
    assert set(payoff) == set(study_records.payoff_keys()) and len(payoff['ffn_kurtosis']) == 4
    assert {'ratio_w8a6', 'ratio_w8a4', 'ratio_w4a8', 'ffn_max_abs',
            'residual_max_abs'} <= set(payoff)
    changes = {'a negative ratio': lambda p: p.update(ratio_w8a4=-0.5),
               'a layer short': lambda p: p['ffn_kurtosis'].pop(),
               'a NaN': lambda p: p['residual_max_abs'].__setitem__(2, math.nan),
               'a key missing': lambda p: p.pop('ratio_w4a8'),
               'a key unknown': lambda p: p.update(ratio_w2a2=1.0)}
    if case == 'not an object':
        record['end']['payoff'] = [1.0]
    else:
        changes[case](payoff)
    # (a NaN has no digest, strict JSON: the payoff is checked before the digest anyway)
    if case != 'a NaN':
        record['digest'] = study_records.digest(record)
    path.write_text(json.dumps(record))
    with pytest.raises(RunError, match=expected) as e:
        study_records.read_records(str(out / 'runs'))
    assert str(path) in str(e.value) and '\n' not in str(e.value)
    del record['end']['payoff']
    record['digest'] = study_records.digest(record)
    path.write_text(json.dumps(record))
    assert 'payoff' not in study_records.read_records(str(out / 'runs'))['kd_softmax_s1']['end']


def test_the_committed_records_before_the_payoff_pass():
    """v1's, its pilot's, v2's and the GPU attempt's records were written before end.payoff: they
    pass as they are."""
    for folder in ('sink_study/runs', 'sink_study/pilot/runs', 'sink_study_v2/runs',
                   'sink_study_gpu/attempt_1/runs'):
        records = study_records.read_records(os.path.join(ROOT, 'docs', folder))
        assert records and not any('payoff' in r['end'] for r in records.values())


@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_an_edited_new_record_stops_the_study(study, tmp_path):
    out, argv = copy_of(study, tmp_path)
    edit(out / 'runs' / 'kd_softmax_s1.json', lambda r: r.update(val_loss=1.0))
    with pytest.raises(RunError, match="kd_softmax_s1.json: .* do not match its digest: it was "
                                       "edited"):
        sink_study.main(argv + ['--report_only=True'])


@pytest.mark.parametrize('flag',
                         ['--gate=True', '--affine_act=sigmoid', '--init_std=0.5', 'data_dir'])
@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_setting_outside_the_recipe_keys_is_seen(flag, study, tmp_path, stdlib_dir):
    """Only the recipe's keys were compared once: --init_std, --affine_act, --gate and --data_dir
    trained nothing and reported the old records under the new command. Now the report refuses them,
    naming the setting."""
    out, argv = copy_of(study, tmp_path)
    if flag == 'data_dir':
        argv = [a for a in argv if not a.startswith('--data_dir')] + [f'--data_dir={stdlib_dir}']
        key = 'data_dir'
    else:
        argv = argv + [flag]
        key = flag[2:].partition('=')[0]
    with pytest.raises(RunError, match=rf"ce_softmax_s1 \(other settings: [^)]*{key} "):
        sink_study.main(argv + ['--report_only=True'])


@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_changed_setting_trains_again_and_says_so(study, tmp_path, capsys):
    out, argv = copy_of(study, tmp_path)
    # the ce run alone
    results = sink_study.main(argv + ['--init_std=0.03', '--arms=ce', '--subset=True'])
    said = capsys.readouterr().out
    assert ('ce_softmax_s1: its record was made with other settings (init_std 0.02 -> 0.03): '
            'trained again' in said)
    assert said.index('trained again') < said.index('$ ')  # before any work
    assert ([r['name'] for r in results['runs']] == ['ce_softmax_s1']
            and results['excluded'] == ['kd_softmax_s1'])
    assert json.loads(
        (out / 'runs' / 'ce_softmax_s1.json').read_text())['settings']['init_std'] == 0.03


@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_seed_given_twice_is_refused_before_any_run(study, tmp_path):
    out, argv = copy_of(study, tmp_path)
    before = sorted(os.listdir(out / 'train'))
    with pytest.raises(RunError, match=r"ce_softmax_s1, kd_softmax_s1: planned twice"):
        sink_study.main(argv + ['--seeds=1,1', '--kd_seeds=1,1'])
    assert sorted(os.listdir(out / 'train')) == before


@pytest.mark.xdist_group('tiny_study')  # its module fixture, built once
def test_a_failed_child_fails_the_study_with_its_last_line(study, tmp_path, capsys, monkeypatch):
    """A run that fails (here: its directory holds a log train.py did not write) stops the study,
    which names the run and what the child said last. Before any work it said how many threads each
    run gets: the user's OMP_NUM_THREADS, where set, is respected (this study also serves that
    check: it has something to do, and stops after its first launch instead of training)."""
    out, argv = copy_of(study, tmp_path)
    run = out / 'train' / 'ce_softmax_s2'
    run.mkdir()
    (run / 'metrics.jsonl').write_text('{"not": "ours"}\n')
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    with pytest.raises(RunError, match=r"run ce_softmax_s2 failed \(exit code 1\): 'train.py: "
                                       r"error: .*"):
        sink_study.main(argv + ['--seeds=1,2', '--kd_seeds=1'])
    assert ('1 at a time, 1 thread(s) each (OMP_NUM_THREADS from the environment)'
            in capsys.readouterr().out)


def study_process(argv, out):
    return subprocess.Popen([sys.executable, '-m', 'study.sink_study', *argv], cwd=ROOT,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED='1'))


def wait_for_training(out, name, timeout=120):
    """Until the run's train.py has logged a step (its checkpoint then follows a stop)."""
    path = out / 'train' / name / 'metrics.jsonl'
    deadline = time.time() + timeout
    while not (path.is_file() and path.stat().st_size > 0):
        assert time.time() < deadline, f"{name} did not start"
        time.sleep(0.2)


def children(out):
    """pids of train.py processes whose command names this study's directory."""
    # (-ww: whole command lines; cut at the terminal's width, they named no directory)
    ps = subprocess.run(['ps', '-ww', '-eo', 'pid,args'], capture_output=True,
                        text=True).stdout.splitlines()
    return [line for line in ps if 'train.py' in line and str(out) in line]


@pytest.mark.parametrize('signum, to', [(signal.SIGTERM, 'study'), (signal.SIGINT, 'study'),
                                        (signal.SIGTERM, 'run')])
def test_a_signal_stops_the_children_and_a_rerun_continues(signum, to, study_data, tmp_path):
    """SIGTERM once killed the study silently and left its train.py children training as orphans;
    Ctrl-C gave a traceback. Now the study stops its children (each saves its checkpoint), exits
    with one line and 128 + the signal's number (issue 62: as a shell reports a program the signal
    ended); the same command then continues the run from its checkpoint, and nothing is trained
    twice. A run stopped by a signal of its own (it saves, and exits 143) stops the study the same
    way: a stop, not a failed run."""
    out = tmp_path / 'study'
    # (a run the study stops is not rerun here; one stopped alone must still be training then)
    tokens = 30000 if to == 'study' else 3_000_000
    argv = [f'--out_dir={out}', f'--data_dir={study_data}', '--variants=softmax', '--arms=ce',
            '--seeds=1',
            f'--tokens={tokens}', '--block_size=32', '--compile=False', '--eval_batches=1',
            '--jobs=1', '--log_interval=1']
    proc = study_process(argv, out)
    wait_for_training(out, 'ce_softmax_s1')
    if to == 'run':
        os.kill(int(children(out)[0].split()[0]), signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum and err.strip().count('\n') == 0, err
    assert f'stopped by {signal.Signals(signum).name}' in err and 'ce_softmax_s1' in err
    if to == 'run':
        assert err.strip() == ('sink_study.py: error: run ce_softmax_s1 was stopped by SIGTERM (it '
                               'saved its last step); run the same command again to continue')
    assert children(out) == []
    steps = [json.loads(line)['step']
             for line in (out / 'train' / 'ce_softmax_s1' / 'metrics.jsonl').open()]
    assert (out / 'train' / 'ce_softmax_s1' / 'ckpt.pt').is_file() and steps
    # the same command continues from the checkpoint: every step once (in this process: the
    # study's command is its main, which raises on any failure)
    if signum == signal.SIGTERM and to == 'study':
        sink_study.main(argv)
        steps = [json.loads(line)['step']
                 for line in (out / 'train' / 'ce_softmax_s1' / 'metrics.jsonl').open()]
        assert steps == list(range(1, steps[-1]
                                   + 1)) and (out / 'runs' / 'ce_softmax_s1.json').is_file()
        assert 'resuming from' in (out / 'logs' / 'ce_softmax_s1.log').read_text()


def test_table_5_after_the_warm_up_leaves_the_warm_up_out():
    """Steps 0-4 (the warm-up) spike to 10; after it one step of 5 stands out of a run of 1s (median
    1, MAD 0): one spike at each k, where steps 0-500 would count the warm-up's too. A warm-up that
    reaches the end leaves none."""
    grad = [10.0] * 5 + [1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0]
    assert sink_study.spikes_after_warmup(grad, 5) == dict(spikes_after_warmup={'6': 1, '9': 1},
                                                           spikes_after_warmup_window=[5, 13])
    assert sink_study.spikes_after_warmup(grad, 100) == dict(spikes_after_warmup=None,
                                                             spikes_after_warmup_window=[13, 13])


def test_the_v2_plan(data_dir, tmp_path, capsys):
    """--plan=v2 before any run: the four core variants distilled, 12 seeds each, from two teachers
    of their own shape (seeds 101 and 102, which no student has). Its report is blind: written once,
    after the last of its 50 runs, so --report_only on a part writes nothing and says how many are
    recorded."""
    argv = ['--plan=v2', f'--report_dir={tmp_path / "v2"}', f'--out_dir={tmp_path / "out"}',
            f'--data_dir={data_dir}', '--report_only=True']
    runs, _, _ = sink_study.plan_runs(*sink_study.parse_args(argv))
    assert sorted(r['name'] for r in runs) == sorted(
        ['teacher_softmax_s101', 'teacher_softmax_s102'] +
        [f'kd_{v}_s{s}' for v in ('softmax', 'sink', 'gated', 'affine') for s in range(1, 13)])
    assert {r['teacher'] for r in runs if r['arm'] == 'kd'} == {'teacher_softmax_s101',
                                                                'teacher_softmax_s102'}
    assert sink_study.main(argv) is None
    assert ('0 of 50 runs recorded (50 to go: kd_affine_s1, kd_affine_s10, kd_affine_s11, '
            'kd_affine_s12, kd_affine_s2, kd_affine_s3 and 44 more)') in capsys.readouterr().out
    assert not (
        tmp_path / 'v2' / 'report.md').exists() and not (tmp_path / 'v2' / 'results.json').exists()
    (tmp_path / 'v2' / 'runs').mkdir(parents=True)  # (issue 53) one run missing: named
    for name in [r['name'] for r in runs if r['name'] != 'kd_gated_s7']:
        shutil.copy(os.path.join(ROOT, 'docs', 'sink_study_v2', 'runs', f'{name}.json'),
                    tmp_path / 'v2' / 'runs')
    shutil.copy(os.path.join(ROOT, 'docs', 'sink_study_v2', 'seal.json'), tmp_path / 'v2')
    assert sink_study.main(argv) is None
    assert '49 of 50 runs recorded (1 to go: kd_gated_s7)' in capsys.readouterr().out



def test_the_console_shows_steps_and_finiteness_never_a_value(tmp_path, capsys):
    """While a study trains, its console line gives each running run's step and whether its loss is
    finite, and no number a test reads (a blind study's measures stay unread until its last run
    ends)."""
    runs = []
    for name, loss in (('kd_affine_s1', 1.25), ('kd_sink_s1', math.nan)):
        (tmp_path / name).mkdir()
        (tmp_path / name / 'metrics.jsonl').write_text(json.dumps(dict(step=7, loss=loss,
                                                                       val_loss=2.5)) + '\n')
        runs.append(dict(name=name, state='new',
                         config=run_config(dict(out_dir=str(tmp_path / name)))))
    running = {r['name']: (None, r, None) for r in runs}
    sink_study.progress(runs, running, 10, {r['name']: 0 for r in runs}, time.time() - 60)
    line = capsys.readouterr().out
    assert 'kd_affine_s1 7/10, kd_sink_s1 7/10 (loss not finite)' in line
    assert '1.25' not in line and '2.5' not in line and 'nan' not in line.lower()


@pytest.mark.parametrize('flag',
                         ['--config=config/sink_study.py,nope.py', '--teacher_config=nope.py'])
def test_a_config_file_that_is_not_there_is_one_line(flag, tmp_path):
    """Once a train.py usage screen under train.py's name; now the study's own one line, before any
    work."""
    with pytest.raises(RunError, match=r"^--(teacher_)?config=.*: no such file: nope\.py$"):
        sink_study.main([flag, f'--out_dir={tmp_path}', '--report_only=True'])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('key, said',
                         [('val_loss', 'it holds NaN or an infinity, which the study never writes'),
                          ('final_kd_loss',
                                        'final_kd_loss is nan, not a finite number')])
def test_a_nan_written_into_a_sealed_record_is_one_line(key, said, tmp_path):
    """Issue 53: a NaN literal edited into a v2 record (which holds a digest) stopped a report with
    JSON's traceback; now one line names the file and says the study never writes one."""
    runs = tmp_path / 'runs'
    runs.mkdir()
    with open(os.path.join(ROOT, 'docs', 'sink_study_v2', 'runs', 'kd_affine_s1.json'),
              encoding='utf-8') as f:
        text = f.read()
    record = json.loads(text)
    record[key] = float('nan')
    (runs / 'kd_affine_s1.json').write_text(json.dumps(record))
    with pytest.raises(RunError, match=r"kd_affine_s1\.json: not a valid record of the study: "
                       + said) as e:
        study_records.read_records(str(runs))
    assert '\n' not in str(e.value)


def test_the_readme_command_regenerates_a_report_without_the_corpus(tmp_path, monkeypatch, capsys):
    """Issue 53: v2's command in the README, run as printed, was refused ("68 file(s) differ from
    the seal"), and a report-only run needed the corpus prepared first. Now a command whose every
    run is recorded writes the report from the records, as --report_only=True does (nothing to
    train: no seal to check), and needs no corpus: it is the one results.json names, once that is
    every record's. Where results.json does not name it, --report_only=True says in one line how to
    prepare it (the command alone prepares it). (Here the repository is a copy without data/.)"""
    root = tmp_path / 'repo'
    shutil.copytree(os.path.join(ROOT, 'docs', 'sink_study_v2'), root / 'docs' / 'sink_study_v2')
    (root / 'config').symlink_to(os.path.join(ROOT, 'config'))
    monkeypatch.setattr(sink_study, 'HERE', str(root))
    sink_study.main(['--plan=v2', '--report_dir=docs/sink_study_v2'])  # the README's command
    assert 'its report is written from them, as --report_only=True does' in capsys.readouterr().out
    for name in ('report.md', 'results.json'):
        with open(os.path.join(ROOT, 'docs', 'sink_study_v2', name), encoding='utf-8') as f:
            written = (root / 'docs' / 'sink_study_v2' / name).read_text(encoding='utf-8')
            assert written == f.read(), name
    assert not (root / 'data').exists()
    edit(root / 'docs' / 'sink_study_v2' / 'results.json',
         lambda results: results['corpus'].pop('identity'))
    with pytest.raises(RunError, match=r'needs docs/sink_study_v2/results.json to name the corpus '
                                       r'of every record .* '
                                       r'prepare the corpus first \(python prepare_data.py '
                                       r'--source=stdlib'):
        sink_study.main(['--plan=v2', '--report_dir=docs/sink_study_v2', '--report_only=True'])
