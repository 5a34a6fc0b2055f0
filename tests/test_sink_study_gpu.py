"""A GPU plan on a lent machine (study/sink_study.py; docs/analysis.md, "A GPU plan's folder"):
--mirror_dir keeps every record and the study's state in two files of a folder that leaves the
machine, and a fresh machine goes on from it, a teacher trained there again held to its record;
--dry_run=True sizes a command's memory and schedule without training. CPU only: v3_gpu's plan at
the dry run's tiny shapes, one student seed."""
import datetime
import json
import shutil

import pytest

from lmkit.errors import RunError
from study import sink_study
from study.study_results import minutes
from test_sink_study import GPU_DRY_RUN

TEACHER = 'teacher_softmax_s501'
STUDENTS = [f'kd_{v}_s401' for v in ('softmax', 'sink', 'gated', 'affine')]
TINY = [a for a in GPU_DRY_RUN if not a.startswith('--kd_seeds=')] + ['--kd_seeds=401',
                                                                      '--teachers=501']


def study(data_dir, root, mirror, *more):
    """v3_gpu's plan at the tiny shapes, out_dir and report_dir (sealed here: a blind study) under
    root."""
    from helpers import seal_here
    report = root / 'report'
    if not report.exists():
        seal_here(report)
    return sink_study.main(['--plan=v3_gpu', f'--data_dir={data_dir}', f'--out_dir={root / "out"}',
                            f'--report_dir={report}', f'--mirror_dir={mirror}', *TINY, *more])


@pytest.fixture(scope='module')
def first_machine(study_data, tmp_path_factory):
    """The study trained once with a mirror: (its root, its mirror)."""
    root = tmp_path_factory.mktemp('first_machine')
    study(study_data, root, root / 'mirror')
    return root, root / 'mirror'


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file())


def trained_here(root):
    """The runs whose train.py this machine ran (each has a log in out_dir/logs)."""
    logs = root / 'out' / 'logs'
    return sorted(p.name[:-len('.log')] for p in logs.glob('*.log')) if logs.is_dir() else []


def mirrored(mirror):
    return json.loads((mirror / 'records.json').read_text())


@pytest.mark.xdist_group('first_machine')  # its module fixture, built once
def test_the_mirror_holds_every_record_and_the_state_in_two_files(first_machine):
    """After the study: records.json, every record as report_dir holds it, and state.json (plan,
    seal, command, runs recorded, none training, the time); nothing else (a lent machine returns a
    few small files)."""
    root, mirror = first_machine
    names = sorted([TEACHER, *STUDENTS])
    assert files_under(mirror) == ['records.json', 'state.json']
    records = mirrored(mirror)
    assert sorted(records) == names
    for name in names:
        assert records[name] == json.loads((root / 'report' / 'runs' / f'{name}.json').read_text())
    state = json.loads((mirror / 'state.json').read_text())
    assert (state['plan'], state['seal'], state['recorded'], state['training']) == ('v3_gpu',
                                                                                    'a' * 40, names,
                                                                                    {})
    assert f'--mirror_dir={mirror}' in state['command']
    assert datetime.datetime.fromisoformat(state['updated']).tzinfo is not None


@pytest.mark.xdist_group('first_machine')  # its module fixture, built once
def test_a_fresh_machine_restores_the_mirror_and_trains_nothing(first_machine, study_data, tmp_path,
                                                                capsys):
    """Empty out_dir and report_dir, the mirror copied back: every record restored, no run trained,
    the report written from the first machine's records."""
    root, mirror = first_machine
    shutil.copytree(mirror, tmp_path / 'mirror')
    results = study(study_data, tmp_path, tmp_path / 'mirror')
    assert "restored 5 record(s)" in capsys.readouterr().out
    assert trained_here(tmp_path) == [] and (tmp_path / 'report' / 'report.md').is_file()
    assert sorted(r['name'] for r in results['runs']) == sorted([TEACHER, *STUDENTS])
    assert files_under(tmp_path / 'report' / 'runs') == files_under(root / 'report' / 'runs')
    for name in files_under(root / 'report' / 'runs'):
        assert json.loads((tmp_path / 'report' / 'runs' / name).read_text()) == json.loads(
            (root / 'report' / 'runs' / name).read_text())


@pytest.mark.xdist_group('first_machine')  # its module fixture, built once
def test_a_fresh_machine_trains_what_the_mirror_lacks_from_the_recorded_teacher(
        first_machine, study_data, tmp_path, capsys):
    """A student's record missing from the mirror: its teacher's weights stayed on the first
    machine, so the teacher trains again, is held to its record (the same measures to the last
    digit: the CPU trains it alike) and keeps it; then that student trains, and its record is the
    first machine's measure for measure. A mirror whose record of it differs then stops the
    study."""
    root, mirror = first_machine
    shutil.copytree(mirror, tmp_path / 'mirror')
    missing = 'kd_affine_s401'
    records = mirrored(tmp_path / 'mirror')
    del records[missing]
    (tmp_path / 'mirror' / 'records.json').write_text(json.dumps(records))
    study(study_data, tmp_path, tmp_path / 'mirror')
    assert "restored 4 record(s)" in capsys.readouterr().out and trained_here(tmp_path) == [missing,
                                                                                            TEACHER]
    new, first = (json.loads((r / 'report' / 'runs' / f'{missing}.json').read_text())
                  for r in (tmp_path, root))
    assert new['teacher'] == TEACHER
    assert (new['final_kd_loss'], new['val_loss'], new['first_token_weight']) == (
        first['final_kd_loss'], first['val_loss'], first['first_token_weight'])
    assert mirrored(tmp_path / 'mirror')[missing] == new
    assert json.loads(
        (tmp_path / 'mirror' / 'state.json').read_text())['recorded'] == sorted([TEACHER,
                                                                                 *STUDENTS])
    with pytest.raises(RunError, match=f"{missing}: its record in .* differs from the mirror's"):
        # the first machine's mirror: another training's record of it
        study(study_data, tmp_path, mirror)


def test_a_teacher_trained_again_must_be_its_record():
    """same_teacher: equal measures pass; any difference is one line naming the teacher and the
    measure."""
    recorded = dict(val_loss=2.0, first_token_weight=[0.5, 0.1], entropy=[2.0, 2.1])
    sink_study.same_teacher('t', recorded, dict(recorded))
    with pytest.raises(RunError, match=r"^t: trained again .* differs from its record \(val_loss "
                                       r"2\.01 against 2\.0\)"):
        sink_study.same_teacher('t', recorded, dict(recorded, val_loss=2.01))


@pytest.mark.xdist_group('first_machine')  # its module fixture, built once
def test_a_folder_that_is_not_this_studys_mirror_is_refused(first_machine, study_data, tmp_path):
    """Someone else's files, another plan's mirror or a mirror of another seal: one line, before any
    run, and the folder left as it was."""
    notes = tmp_path / 'notes'
    notes.mkdir()
    (notes / 'todo.txt').write_text('mine')
    with pytest.raises(RunError, match=r"holds files that are not a study's mirror \(todo.txt\)"):
        study(study_data, tmp_path / 'a', notes)
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'state.json').write_text(json.dumps(dict(plan='gpu')))
    with pytest.raises(RunError, match=r"holds the mirror of a --plan=gpu study"):
        study(study_data, tmp_path / 'b', other)
    assert files_under(notes) == ['todo.txt'] and files_under(other) == ['state.json']
    assert not (tmp_path / 'a' / 'out').exists() and not (tmp_path / 'b' / 'out').exists()
    resealed = tmp_path / 'resealed'
    shutil.copytree(first_machine[1], resealed)
    state = json.loads((resealed / 'state.json').read_text())
    (resealed / 'state.json').write_text(json.dumps(state | dict(seal='b' * 40)))
    with pytest.raises(RunError, match=r"mirrors the study sealed at b{40}, not this one's seal "
                                       r"\(a{40}\)"):
        study(study_data, tmp_path / 'c', resealed)
    assert trained_here(tmp_path / 'c') == [] and not (tmp_path / 'c' / 'report' / 'runs').exists()


def check_schedule(rows, runs, jobs, seconds):
    """run_all's rules: every run once, for its time; a student starts once its teacher has ended;
    never more than jobs at once, each in a slot of its own."""
    assert sorted(r['name'] for r in rows) == sorted(r['name'] for r in runs)
    at = {r['name']: r for r in rows}
    for run in runs:
        row = at[run['name']]
        assert row['end'] == pytest.approx(row['start'] + seconds[run['name']])
        if run['teacher'] in at:
            assert row['start'] >= at[run['teacher']]['end']
    for row in rows:
        side_by_side = [r for r in rows if r['start'] <= row['start'] < r['end']]
        assert len(side_by_side) <= jobs and 1 <= row['slot'] <= jobs
        assert len({r['slot'] for r in side_by_side}) == len(side_by_side)


def test_the_schedule_keeps_run_alls_rules():
    """schedule (the dry run's simulation): students after their teachers, at most jobs at once, a
    free slot taking the first ready run in priority's order; a teacher not among the runs
    (recorded) holds none back."""
    runs = ([dict(name='t1', teacher=None), dict(name='t2', teacher=None)]
            + [dict(name=f's{i}', teacher='t1' if i % 2 else 't2') for i in range(1, 7)]
            + [dict(name='late', teacher='t0')])
    seconds = dict(t1=10, t2=30, s1=5, s2=7, s3=5, s4=7, s5=20, s6=1, late=3)
    rows = sink_study.schedule(runs, 3, seconds)
    check_schedule(rows, runs, 3, seconds)
    at = {r['name']: r for r in rows}
    # t0 is not planned
    assert at['late']['start'] == 0 and at['s1']['start'] == 10 and at['s2']['start'] == 30
    one = sink_study.schedule(runs, 1, seconds)
    assert [r['name'] for r in one] == [r['name']
                                        for r in runs] and one[-1]['end'] == sum(seconds.values())
    with pytest.raises(RunError, match="s1 waits for its teacher t1"):
        sink_study.schedule([dict(name='s1', teacher='t1'), dict(name='t1', teacher='s1')], 2,
                            dict(s1=1, t1=1))


def test_v3_gpus_schedule_from_attempt_1s_times(data_dir):
    """v3_gpu's 39 runs on 4 slots, each timed from attempt_1's records (a teacher 28.8 s + 45.0 s
    of steps for its 11,993,088 tokens, a student 29.1 s + the students' mean, 44.7 s, scaled to
    v3_gpu's 5M tokens): three teachers side by side, then nine waves of four students, under 8
    minutes."""
    args, overrides = sink_study.parse_args(['--plan=v3_gpu', f'--data_dir={data_dir}',
                                             '--dry_run=True'])
    runs, steps, per_step = sink_study.plan_runs(args, overrides)
    times = sink_study.attempt_times()
    assert times['teacher'] == pytest.approx((28.8, 45.0 / 11_993_088))
    assert times['student'] == pytest.approx((29.1,
                                              (45.2 + 48.0 + 47.7 + 52.3 + 36.0
                                               + 38.8) / 6 / 11_993_088))
    teachers = {r['teacher'] for r in runs}
    seconds = {r['name']: times['teacher' if r['name'] in teachers else 'student'][0]
               + steps * per_step *
               times['teacher' if r['name'] in teachers else 'student'][1] for r in runs}
    ordered = sorted(runs, key=lambda r: sink_study.priority(r, runs))
    rows = sink_study.schedule(ordered, 4, seconds)
    check_schedule(rows, runs, 4, seconds)
    assert [r['name'] for r in rows[:3]] == ['teacher_softmax_s501', 'teacher_softmax_s502',
                                             'teacher_softmax_s503']
    assert max(r['end'] for r in rows) == pytest.approx(seconds[rows[0]['name']]
                                                        + 9 * seconds['kd_softmax_s401'])
    assert 7.5 * 60 < max(r['end'] for r in rows) < 8 * 60


def test_the_dry_run_plans_and_trains_nothing(data_dir, tmp_path, capsys):
    """--dry_run=True on v3_gpu (softmax students alone, to keep it short): train.py's own memory
    plan of each run shape, then every run's slot, start and end labelled ESTIMATE, and the total,
    its last end; no directory made."""
    out, report = tmp_path / 'out', tmp_path / 'report'
    rows = sink_study.main(['--plan=v3_gpu', '--variants=softmax', f'--data_dir={data_dir}',
                            f'--out_dir={out}', f'--report_dir={report}', '--dry_run=True'])
    printed = capsys.readouterr().out
    # the teachers' shape, the students'
    assert printed.count('memory per GPU, estimated: DDP on 1 GPUs') == 2
    assert len(rows) == 12 and not out.exists() and not report.exists()
    lines = [line for line in printed.splitlines() if line.startswith('  slot ')]
    assert len(lines) == 12 and all(line.endswith('ESTIMATE') for line in lines)
    total = max(r['end'] for r in rows)
    assert f"total {minutes(total)}, ESTIMATE (from attempt_1's runs on one H200)" in printed
    assert f"end {minutes(total):>6}  ESTIMATE" in lines[-1]
