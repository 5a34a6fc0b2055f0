"""train.py on tiny configs: learning, exact resume (also after SIGTERM), DDP = single process,
guards."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext

import pytest
import torch

from lmkit import distributed
import prepare_data
import train
from lmkit import runs
from lmkit.data import Windows
from prepare_data import read_shard
from lmkit.errors import RunError, Stopped
from helpers import ROOT, metrics, tiny_args


def test_loss_goes_down(data_dir, tmp_path):
    train.main(tiny_args(data_dir, tmp_path, '--attention=affine', '--max_iters=40',
                         '--learning_rate=3e-3'))
    losses = [r['loss'] for r in metrics(tmp_path)]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    final = metrics(tmp_path)[-1]
    assert {'val_loss', 'val_ppl', 'attn_logit_mean', 'alpha_mean', 'alpha_ma'} <= set(final)
    assert json.load(open(tmp_path / 'config.json'))['attention'] == 'affine'


@pytest.mark.parametrize('attention', ['affine', 'sink'])
def test_resume_is_bit_exact(data_dir, tmp_path, attention):
    full, part = tmp_path / 'full', tmp_path / 'part'
    train.main(tiny_args(data_dir, full, f'--attention={attention}', '--max_iters=8',
                         '--eval_interval=4'))
    train.main(tiny_args(data_dir, part, f'--attention={attention}', '--max_iters=4',
                         '--eval_interval=4'))
    train.main(tiny_args(data_dir, part, f'--attention={attention}', '--max_iters=8',
                         '--eval_interval=4', '--init_from=resume'))
    a, b = metrics(full), metrics(part)
    assert [r['step'] for r in b] == list(range(1, 9))
    for key in ('loss', 'grad_norm', 'lr'):
        assert [r[key] for r in a] == [r[key] for r in b]  # bit-exact, not approximately
    assert a[-1]['val_loss'] == b[-1]['val_loss']


def train_process(data_dir, run, *extra, **popen_args):
    """train.py on a tiny config that would run for hours, as a process, once it has logged three
    steps."""
    proc = subprocess.Popen([sys.executable, 'train.py',
                             *tiny_args(data_dir, run, '--max_iters=1000000', *extra)],
                            cwd=ROOT, text=True, **popen_args)
    deadline = time.time() + 120
    while not (os.path.exists(run / 'metrics.jsonl') and len(metrics(run)) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc


def stop_and_read_step(proc, signum, run, stream):
    """Sends signum to a train_process run and returns the step its checkpoint saved, once the
    run has exited 128 + signum (as a shell reports a program the signal ended: a chain such as
    train && eval stops) with its last line on `stream` (0: stdout, 1: stderr) saying so."""
    proc.send_signal(signum)
    out = proc.communicate(timeout=120)[stream]
    saved = torch.load(run / 'ckpt.pt', weights_only=False)['step']
    assert proc.returncode == 128 + signum and out.splitlines()[-1] == (
        f"train.py: error: stopped by {signal.Signals(signum).name}: saved {run / 'ckpt.pt'} at "
        f"step {saved}; the same command continues it"), out
    return saved


def test_sigterm_saves_a_checkpoint_and_resume_continues_exactly(data_dir, tmp_path):
    run, ref = tmp_path / 'run', tmp_path / 'ref'
    # constant lr after warmup: max_iters may differ
    common = ['--attention=affine', '--decay_frac=0.0']
    proc = train_process(data_dir, run, *common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopped_at = stop_and_read_step(proc, signal.SIGTERM, run, 0)
    assert stopped_at >= 3 and len(metrics(run)) == stopped_at
    train.main(tiny_args(data_dir, run, *common, f'--max_iters={stopped_at + 3}',
                         '--init_from=resume'))
    train.main(tiny_args(data_dir, ref, *common, f'--max_iters={stopped_at + 3}'))
    assert [r['loss'] for r in metrics(run)] == [r['loss'] for r in metrics(ref)]


def test_sighup_saves_as_sigterm_does(data_dir, tmp_path):
    """Issue 62: SIGHUP (the terminal or the ssh connection closed) ended train.py at once, exit
    status 129 and no checkpoint: the steps since the last evaluation were lost. Now it saves the
    step reached, as SIGTERM and SIGINT do, says so, and exits 129 (128 + SIGHUP)."""
    run = tmp_path / 'run'
    proc = train_process(data_dir, run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    saved = stop_and_read_step(proc, signal.SIGHUP, run, 1)
    assert saved >= 3 and [r['step'] for r in metrics(run)] == list(range(1, saved + 1))


def test_a_closed_stdout_is_a_stop_that_saves(data_dir, tmp_path):
    """Issue 62: `train.py ... | head -3` ended at the first console line after head's third, exit
    status 1, no message and nothing saved. Now the reader gone is a stop like a signal: the step
    is saved, one line on stderr says so, and the exit status is 141 (128 + SIGPIPE, a shell's
    own for a writer whose reader is gone)."""
    run = tmp_path / 'run'
    proc = train_process(data_dir, run, '--log_interval=1', stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    head = [proc.stdout.readline() for _ in range(3)]  # what head -3 reads, then it ends
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    saved = torch.load(run / 'ckpt.pt', weights_only=False)['step']
    assert head[0].startswith('init_from=auto: starting fresh') and head[2].startswith('step 1/')
    assert proc.returncode == 141 and err.splitlines()[-1] == (
        "train.py: error: stopped: its standard output was closed (the reader of it, say | head, "
        f"ended): saved {run / 'ckpt.pt'} at step {saved}; the same command continues it"), err
    assert saved >= 3 and [r['step'] for r in metrics(run)] == list(range(1, saved + 1))


def test_a_finished_run_run_again_has_nothing_to_do(data_dir, tmp_path, capsys):
    """Issue 62: the command of a finished run, run again, said "resuming from ... at step 4" and
    exited 0 without saying that nothing was left to do. Now it says so, exits 0 and leaves the
    run's files as they were."""
    args = tiny_args(data_dir, tmp_path, '--max_iters=4', '--eval_interval=4')
    train.main(args)
    before = {name: (tmp_path / name).stat().st_mtime_ns for name in os.listdir(tmp_path)}
    capsys.readouterr()
    train.main(args)
    assert capsys.readouterr().out.splitlines() == [
        f"init_from=auto: resuming from {tmp_path / 'ckpt.pt'} at step 4: nothing to do, "
        "max_iters=4 (a larger one continues the run)"]
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in os.listdir(tmp_path)} == before


def test_two_ranks_match_one_process_with_twice_the_accumulation(data_dir, tmp_path):
    one, two = tmp_path / 'one', tmp_path / 'two'
    # init_std=0.3 spreads alpha over its range, so a wrong alpha_ma reduction shows
    args = ['--attention=affine', '--max_iters=4', '--eval_interval=4', '--micro_batch_size=2',
            '--init_std=0.3']
    train.main(tiny_args(data_dir, one, *args))  # 1 process x 4 micro-steps
    result = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                             '--nproc_per_node=2',
                             # 2 ranks x 2 micro-steps
                             'train.py', *tiny_args(data_dir, two, *args)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    a, b = metrics(one), metrics(two)
    for key in ('loss', 'grad_norm'):
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], rel=1e-5)
    # eval is split over the ranks
    assert a[-1]['val_loss'] == pytest.approx(b[-1]['val_loss'], rel=1e-6)
    for layer in range(2):  # alpha_ma is global-batch exact, per head, at full precision
        name = f'model.layers.{layer}.self_attn.alpha_ma'
        ma_one, ma_two = (torch.load(d / 'ckpt.pt', weights_only=False)['model'][name]
                          for d in (one, two))
        torch.testing.assert_close(ma_one, ma_two, rtol=1e-6, atol=1e-7)


def test_step_batches_cover_each_window_once_per_epoch(data_dir):
    windows = Windows(data_dir, 'train', 64)
    n, g = len(windows), 16
    seen = [i for s in range(n // g) for i in windows.step_indices(7, s, g)]
    assert len(set(seen)) == len(seen) == (n // g) * g
    assert windows.step_indices(7, 3, g) == Windows(data_dir, 'train', 64).step_indices(7, 3, g)
    assert windows.step_indices(7, 3, g) != windows.step_indices(8, 3, g)
    x, y = windows.get([0, 5])
    assert (x[:, 1:] == y[:, :-1]).all() and x.shape == (2, 64)
    tokens = read_shard(os.path.join(data_dir, 'train_000000.bin'))
    # window k starts at token 64 k
    assert (x[1] == tokens[5 * 64:6 * 64]).all() and y[1, -1] == tokens[6 * 64]
    with pytest.raises(RunError, match='the val split has fewer than block_size'):
        Windows(data_dir, 'val', 10 ** 6)


def test_learning_rate_schedule():
    c = dict(runs.KEY_DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=10, max_iters=100,
             decay_frac=0.2)
    lrs = [train.learning_rate(s, c) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0  # linear warmup
    assert set(lrs[10:80]) == {1.0}  # stable
    # linear decay towards min_lr
    assert lrs[80] == 1.0 and lrs[99] == pytest.approx(0.1 + 0.9 / 20)
    assert all(a >= b for a, b in zip(lrs[80:], lrs[81:]))


def test_checkpoint_from_compiled_model_has_plain_names(data_dir, tmp_path):
    train.main(tiny_args(data_dir, tmp_path, '--compile=True', '--max_iters=1', '--n_layer=1'))
    state = torch.load(tmp_path / 'ckpt.pt', weights_only=False)
    assert not any(k.startswith('_orig_mod.') for k in state['model'])
    assert 'model.layers.0.self_attn.q_proj.weight' in state['model']
    assert state['tokenizer']['family'] == 'bytes' and state['step'] == 1


def test_non_finite_loss_stops_or_is_skipped(data_dir, tmp_path, capsys, monkeypatch):
    """A learning rate of 1e30 (past learning_rate's range, so set in the schedule): step 1 is
    finite and its update blows the weights up, so every later step is non-finite."""
    monkeypatch.setattr(train, 'learning_rate', lambda step, c: 1e30)
    with pytest.raises(RunError, match=r'step 2: non-finite .* --learning_rate=<lower> '
                                       r'--resume_lr_change=True'):
        train.main(tiny_args(data_dir, tmp_path / 'stop', '--max_iters=10'))
    with pytest.raises(RunError, match=r'step 2: the run has skipped 1 step\(s\) .* the first at '
                                       r'step 2: more than '
                                       r'max_skipped_frac=0.05 of max_iters=8; stopping without '
                                       r'saving') as e:
        train.main(tiny_args(data_dir, tmp_path / 'many', '--max_iters=8', '--nonfinite=skip'))
    assert '\n' not in str(e.value) and not (tmp_path / 'many' / 'ckpt.pt').exists()
    capsys.readouterr()
    train.main(tiny_args(data_dir, tmp_path / 'skip', '--max_iters=4', '--nonfinite=skip',
                         '--max_skipped_frac=1'))
    assert [r['skipped_steps'] for r in metrics(tmp_path / 'skip')] == [0, 1, 2, 3]
    assert (capsys.readouterr().out.endswith("nonfinite=skip: 3 of the run's 4 steps were skipped "
                                             "(non-finite loss or gradient norm), the first at "
                                             "step 2\n"))
    assert torch.load(tmp_path / 'skip' / 'ckpt.pt', weights_only=False)['skipped'] == dict(steps=3,
                                                                                            first=2)


def test_settings_larger_than_the_data_stop_before_any_work(data_dir, tmp_path):
    """A step's batch beyond the train split (1e8 sequences against 1,695 windows was OOM-killed)
    and attention_windows beyond the val split (an IndexError at the first evaluation): one line,
    nothing written."""
    n_train, n_val = (len(Windows(data_dir, split, 32)) for split in ('train', 'val'))
    for args, message in [
            (['--global_batch_size=100000000'],
             f"global_batch_size=100,000,000: the train split of data_dir={data_dir} holds "
             f"{n_train:,} windows of 32 tokens, and one step would read some of them more than "
             f"once; give at most {n_train:,}"),
            (['--attention_windows=100000'],
             f"attention_windows=100,000: the val split of data_dir={data_dir} holds {n_val:,} "
             f"windows of 32 tokens; give at most {n_val:,}")]:
        with pytest.raises(RunError) as e:
            train.main(tiny_args(data_dir, tmp_path / 'run', '--max_iters=1', *args))
        assert str(e.value).startswith(message) and '\n' not in str(e.value)
    assert not (tmp_path / 'run').exists()


def reading_val(monkeypatch, on_read=None):
    """The index lists train.py's val windows are read with, in order, as it reads them (each after
    on_read())."""
    read, load = [], train.load_data

    def load_data(c, model_config):
        meta, train_data, val_data = load(c, model_config)
        get = val_data.get
        val_data.get = lambda indices: (on_read and on_read(), read.append(list(indices)),
                                        get(indices))[-1]
        return meta, train_data, val_data
    monkeypatch.setattr(train, 'load_data', load_data)
    return read


def test_an_evaluation_reads_the_val_split_once_at_most(data_dir, tmp_path, capsys, monkeypatch):
    """--eval_batches=100000 read the val split's windows again and again (killed after 216 s): an
    evaluation now reads each window once, and the run says so as it starts."""
    read = reading_val(monkeypatch)
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=1', '--eval_batches=100000',
                         '--micro_batch_size=32', '--global_batch_size=32', '--warmup_iters=0'))
    n_val, batches = len(Windows(data_dir, 'val',
                                 32)), math.ceil(len(Windows(data_dir, 'val', 32)) / 32)
    assert capsys.readouterr().err.splitlines() == [
        f"note: eval_batches=100,000 x micro_batch_size=32 is more than the {n_val:,} windows the "
        f"val split of data_dir={data_dir} holds: each evaluation reads {batches} batches, every "
        "window once"]
    loss_batches = read[:-1]  # (the last: the window the mean attention logit is measured on)
    assert len(loss_batches) == batches and {i for b in loss_batches
                                             for i in b} == set(range(n_val))
    assert 'val_loss' in metrics(tmp_path)[-1]


def test_sigterm_during_an_evaluation_stops_it_within_a_few_batches(data_dir, tmp_path,
                                                                    monkeypatch):
    """SIGTERM waited for the evaluation to end (100000 batches took minutes; here 100). Now it
    stops within EVAL_STOP_EVERY batches; the step is saved, its record written without an
    evaluation (none half done), and the same command continues the run."""
    read = reading_val(monkeypatch, on_read=lambda: read or os.kill(os.getpid(), signal.SIGTERM))
    args = tiny_args(data_dir, tmp_path, '--max_iters=4', '--eval_interval=2', '--warmup_iters=0')
    with pytest.raises(Stopped) as stop:
        train.main(args + ['--eval_batches=100'])
    assert 1 <= len(read) <= train.EVAL_STOP_EVERY
    assert stop.value.signum == signal.SIGTERM and str(stop.value) == (
        f"stopped by SIGTERM: saved {tmp_path / 'ckpt.pt'} at step 2 (its evaluation, cut short, "
        "is not logged); the same command continues it")
    assert torch.load(tmp_path / 'ckpt.pt', weights_only=False)['step'] == 2
    assert [r['step'] for r in metrics(tmp_path) if 'val_loss' in r] == []
    read.append('no more signals')
    train.main(args)
    assert [r['step'] for r in metrics(tmp_path) if 'val_loss' in r] == [4]


def test_a_warmup_longer_than_the_run_is_warned_about(data_dir, tmp_path, capsys):
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=2', '--warmup_iters=8'))
    assert capsys.readouterr().err.splitlines() == [
        "warning: warmup_iters=8 is longer than max_iters=2: the learning rate never reaches "
        "learning_rate=0.001, only 25% of it at the last step"]
    assert metrics(tmp_path)[-1]['lr'] == pytest.approx(0.001 * 2 / 8)


def test_data_must_fit_the_model_vocabulary(data_dir, tmp_path):
    with pytest.raises(RunError, match='257 token ids but the model has vocab_size=100'):
        train.main(tiny_args(data_dir, tmp_path, '--vocab_size=100', '--max_iters=1'))


@pytest.mark.parametrize('argv,message', [
    (['--lr=1e-3'], "unknown config key 'lr'.*valid keys: .*learning_rate"),
    (['--max_iters=1.5'], 'max_iters=1.5 has type float, expected int'),
    (['--compile=maybe'], "compile='maybe' has type str, expected bool or NoneType"),
    (['--warmup_iters', '5'], 'overrides are written --key=value'),
    (['config/nope.py'], 'config file config/nope.py not found'),
    (['--attention=linear'], 'valid values: softmax, sink, gated, affine, affine_gated'),
    (['--gate=head'], "invalid choice: gate='head'; valid values: none, elementwise, headwise, "
                      "True, False"),
    (['--attention=gated', '--gate=headwise'], "^config: ModelConfig.attention='gated' has the "
                                               "elementwise gate; gate='headwise' contradicts it"),
    (["--init_from=gpt2"], "init_from='gpt2'; valid values: auto, resume, scratch"),
    (['--global_batch_size=6', '--micro_batch_size=4'], 'must be a multiple of world size'),
])
def test_config_errors_are_clear(data_dir, tmp_path, argv, message):
    with pytest.raises((SystemExit, RunError), match=message):  # a flag's error, or the run's
        train.main(tiny_args(data_dir, tmp_path, '--max_iters=1') + argv)


def test_the_gate_takes_its_kinds_and_the_bools_it_was(tmp_path):
    """--gate names its kind (none, elementwise, headwise), or is the bool it was before the
    head-wise gate (a bare --gate is True), on the command line or in a config file; a bool is
    recorded as the kind it names, so a run's config says which gate it has."""
    for argv, kind in [([], 'none'), (['--gate=True'], 'elementwise'), (['--gate'], 'elementwise'),
                       (['--gate=False'], 'none'), (['--gate', 'True'], 'elementwise'),
                       (['--gate=headwise'], 'headwise'), (['--gate=elementwise'], 'elementwise'),
                       (['--gate=none'], 'none')]:
        assert train.load_config(['config/tiny_cpu.py', *argv])['gate'] == kind, argv
    for text, kind in [('True', 'elementwise'), ('False', 'none'), ("'headwise'", 'headwise')]:
        (tmp_path / 'gate.py').write_text(f"gate = {text}\n")
        assert train.load_config([str(tmp_path / 'gate.py')])['gate'] == kind, text
    (tmp_path / 'gate.py').write_text("gate = None\n")
    with pytest.raises(SystemExit, match=r"gate.py: invalid choice: gate=None; valid values: "
                                         r"none, elementwise, headwise, True, False$"):
        train.load_config([str(tmp_path / 'gate.py')])


def test_overrides_accept_none_lists_dicts_and_ints_for_floats(tmp_path):
    scaling = ("{'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, "
               "'high_freq_factor': 4.0, 'original_max_position_embeddings': 64}")
    c = train.load_config(['config/tiny_cpu.py', '--teacher=None', '--learning_rate=1',
                           f'--rope_scaling={scaling}', '--wandb_run_name=run 1'])
    assert c['teacher'] is None and c['learning_rate'] == 1.0 and isinstance(c['learning_rate'],
                                                                             float)
    assert (c['rope_scaling']['factor'] == 8.0 and c['wandb_run_name'] == 'run 1'
            and c['n_layer'] == 4)


def test_dry_run_prints_parameter_counts_and_the_memory_plan(capsys):
    train.main(['config/affine_gated_1b.py', '--dry_run=True'])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == 'params: total=1303971840 non_embedding=1041303552 attention_extra=68157440'
    assert lines[1].startswith('memory per GPU, estimated: DDP on 8 GPUs, micro_batch_size=4 x '
                               '2048 tokens')
    assert [line.split()[0] for line in lines[2:]] == ['weights', 'gradients', 'optimizer',
                                                       'teacher', 'kd_loss', 'activations', 'total']


def ddp_gradient_storages(world_size, set_to_none):
    """train.py's DDP path (wrap_ddp, no_sync micro-steps, zero_grad) for 2 steps x 3 micro-steps
    on this rank: after every micro-step, the storages that hold the parameters' .grad, and the
    buffers DDP all-reduces (read by a communication hook)."""
    import torch.distributed as dist
    from model import GPT, ModelConfig
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, intermediate_size=64,
                            vocab_size=97, block_size=16, attention='affine'))
    ddp = distributed.wrap_ddp(model, torch.device('cpu'))
    buckets = set()

    def hook(state, bucket):  # DDP's own all-reduce, recording which buffers it reduces
        buckets.add(bucket.buffer().untyped_storage().data_ptr())
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] / world_size)

    ddp.register_comm_hook(None, hook)
    optimizer = train.configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95))
    seen = []  # per micro-step: {storage pointer: bytes} of the .grad tensors
    for step in range(2):
        # as train.py's loop: all-reduced in the last micro-step's backward only
        for micro in range(3):
            x = torch.randint(0, 97, (2, 16))
            with ddp.no_sync() if micro < 2 else nullcontext():
                loss = train.compute_loss(ddp, model, None, x, x)[0]
                (loss / 3).backward()
            seen.append({p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                         for p in model.parameters() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return ddp, dict(seen=seen, buckets=buckets, param_bytes=param_bytes)


def _ddp_gradient_worker(rank, world_size, init_file, result_file):
    """ddp_gradient_storages with set_to_none False, then True, on 2 gloo ranks started once:
    {set_to_none: its record}, saved by rank 0."""
    import gc
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world_size)
    try:
        results = {}
        for set_to_none in (False, True):
            ddp, results[set_to_none] = ddp_gradient_storages(world_size, set_to_none)
            dist.barrier()
            del ddp
            gc.collect()
        if rank == 0:
            torch.save(results, result_file)
    finally:
        dist.destroy_process_group()


def test_ddp_accumulation_keeps_one_copy_of_the_gradients(tmp_path):
    """DDP with gradient_as_bucket_view: in train.py's loop (zero_grad in place) every micro-step's
    .grad tensors are views of the buffers DDP all-reduces, so the gradients exist once;
    set_to_none=True (the old loop) is the counter-example that shows the check can fail: the
    no_sync micro-steps then allocate a second set. Both from one start of the 2 ranks, each with a
    model and DDP of its own."""
    result = tmp_path / 'result.pt'
    torch.multiprocessing.spawn(_ddp_gradient_worker,
                                args=(2, str(tmp_path / 'init'), str(result)),
                                nprocs=2, join=True)
    results = torch.load(result, weights_only=False)
    assert list(results) == [False, True]
    for set_to_none, r in results.items():
        # recorded after each micro-step's backward: 3 per step, the first 2 inside no_sync
        assert len(r['seen']) == 6 and r['buckets']
        one_copy = [set(storages) <= r['buckets'] and sum(storages.values()) == r['param_bytes']
                    for storages in r['seen']]
        if set_to_none:
            # step 1's no_sync micro-steps: fresh tensors beside the buckets
            assert not all(one_copy[3:])
        else:
            assert all(one_copy)


def test_the_same_command_continues_the_run(data_dir, tmp_path, capsys):
    """init_from='auto' (the default): a second run of the same command continues from
    out_dir/ckpt.pt, and the first line of each run says which it did; the result is the
    uninterrupted run's, bit for bit."""
    run, ref = tmp_path / 'run', tmp_path / 'ref'
    common = ['--attention=affine', '--eval_interval=3']
    train.main(tiny_args(data_dir, run, *common, '--max_iters=3'))
    assert capsys.readouterr().out.startswith('init_from=auto: starting fresh\n')
    # may change on resume
    train.main(tiny_args(data_dir, run, *common, '--max_iters=6', '--micro_batch_size=2'))
    assert (capsys.readouterr().out.startswith(f"init_from=auto: resuming from {run / 'ckpt.pt'} "
                                               "at step 3\n"))
    train.main(tiny_args(data_dir, ref, *common, '--max_iters=6'))
    assert [r['step'] for r in metrics(run)] == list(range(1, 7))
    assert [r['loss'] for r in metrics(run)] == pytest.approx([r['loss'] for r in metrics(ref)],
                                                              rel=1e-6)
    ckpt = torch.load(run / 'ckpt.pt', weights_only=False)
    assert ckpt['step'] == 6 and ckpt['data']['train_tokens'] > 0


def test_scratch_never_replaces_a_checkpoint_silently(data_dir, tmp_path, capsys):
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=2', '--eval_interval=2'))
    with pytest.raises(RunError, match=r'holds a run at step 2.*--init_from=scratch '
                                       r'--overwrite=True'):
        train.main(tiny_args(data_dir, tmp_path, '--max_iters=1', '--init_from=scratch'))
    assert torch.load(tmp_path / 'ckpt.pt', weights_only=False)['step'] == 2
    capsys.readouterr()
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=1', '--init_from=scratch',
                         '--overwrite=True'))
    assert (capsys.readouterr().out.startswith("init_from=scratch: starting fresh (replacing "
                                               f"{tmp_path / 'ckpt.pt'})"))
    assert torch.load(tmp_path / 'ckpt.pt',
                      weights_only=False)['step'] == 1 and len(metrics(tmp_path)) == 1


@pytest.mark.parametrize('change,message', [
    (['--learning_rate=2e-3'], "learning_rate: 0.001 -> 0.002"),
    (['--seed=7', '--global_batch_size=16'], "global_batch_size: 8 -> 16\n  - seed: 1337 -> 7"),
    (['--attention=sink'], "attention: 'affine' -> 'sink'"),
    (['--kd_alpha=0.5'], "kd_alpha: 1.0 -> 0.5"),
])
def test_resume_refuses_a_different_run(data_dir, tmp_path, change, message):
    train.main(tiny_args(data_dir, tmp_path, '--attention=affine', '--max_iters=2',
                         '--eval_interval=2'))
    with pytest.raises(RunError) as e:
        train.main(tiny_args(data_dir, tmp_path, '--attention=affine', '--max_iters=4', *change))
    assert message in str(e.value) and 'Keys that may change on resume: ' in str(e.value)


def test_resume_refuses_other_data(data_dir, tmp_path):
    other = str(tmp_path / 'other')
    prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={other}',
                       '--val_every=5', '--num_proc=1'])
    train.main(tiny_args(data_dir, tmp_path / 'run', '--max_iters=2', '--eval_interval=2'))
    with pytest.raises(RunError, match=r'the data: .*train_tokens'):
        train.main(tiny_args(other, tmp_path / 'run', '--max_iters=4'))


def test_resume_from_a_corrupt_checkpoint_is_one_line(data_dir, tmp_path):
    """A ckpt.pt cut short (a copy that stopped) or overwritten: one line naming it and what to do,
    no traceback."""
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=2', '--eval_interval=2'))
    path = tmp_path / 'ckpt.pt'
    for content in (path.read_bytes()[:3000], b'not a checkpoint'):
        path.write_bytes(content)
        for init_from in ('auto', 'resume'):
            with pytest.raises(RunError) as e:
                train.main(tiny_args(data_dir, tmp_path, '--max_iters=4',
                                     f'--init_from={init_from}'))
            message = str(e.value)
            assert (str(path) in message and 'not a readable checkpoint' in message
                    and '\n' not in message)
            assert '--init_from=scratch --overwrite=True' in message


def worker_pids(launcher_pid):
    """{rank: pid} of the workers torchrun (launcher_pid) runs now."""
    pids = {}
    for pid in subprocess.run(['pgrep', '-P', str(launcher_pid)], capture_output=True,
                              text=True).stdout.split():
        try:
            env = dict(item.split('=', 1)
                       for item in open(f'/proc/{pid}/environ').read().split('\0') if '=' in item)
        except OSError:  # exited meanwhile
            continue
        if 'RANK' in env:
            pids[int(env['RANK'])] = int(pid)
    return pids


def wait_until(condition, proc, what):
    """Until condition() holds, while proc (torchrun) runs; two minutes at most."""
    deadline = time.time() + 120
    while not condition():
        assert proc.poll() is None and time.time() < deadline, f"{what}: {proc.communicate()[0]}"
        time.sleep(0.02)


def test_elastic_restarts_continue_from_the_last_checkpoint(data_dir, tmp_path):
    """torchrun --max-restarts: a worker killed (SIGKILL, no chance to save) twice mid-run; torchrun
    restarts every rank with the same arguments, which continue from the last checkpoint: at most
    eval_interval steps are redone per kill, and the weights are bit-identical to an uninterrupted
    run's. Issue 62, the race it lost under load: its run of 24 steps went on while the test waited
    to see step 15, and a test process kept off the cores for the few seconds of the last 9 steps
    found the run over, and no worker to kill. The run now has no end of its own (its learning rate
    constant after the warmup, so that max_iters changes nothing): SIGTERM ends it, once its
    second restart has trained, with a save; the reference trains to the step it saved. Each step
    looked for is one of the attempt now running: a restart's rank 0 writes a new log (a new inode),
    and until it has, the log read is the attempt's before. torchrun is paused (SIGSTOP) from each
    kill until the steps redone are counted: a restart meanwhile would rewrite the log read."""
    args = ['--attention=affine', '--eval_interval=4', '--micro_batch_size=2', '--decay_frac=0.0']
    launch = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    run, ref = tmp_path / 'run', tmp_path / 'ref'
    proc = subprocess.Popen([*launch, '--max-restarts=2', 'train.py',
                             *tiny_args(data_dir, run, *args, '--max_iters=1000000')], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, before = run / 'metrics.jsonl', None  # before: the log's inode as the last attempt left it

    def logged():
        """The last step the running attempt has logged (0 before it has written its log)."""
        try:
            ours = os.stat(log).st_ino != before
            return ours and (metrics(run) or [{'step': 0}])[-1]['step']
        except FileNotFoundError:
            return 0
    redone = []
    # past a checkpoint (steps 4 and 12), before the next one
    for kill_at, rank in ((6, 1), (15, 0)):
        wait_until(lambda: logged() >= kill_at and len(worker_pids(proc.pid)) == 2, proc,
                   f'step {kill_at}')
        workers = worker_pids(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        os.kill(workers[rank], signal.SIGKILL)
        # the checkpoint first, then the log: a step's record is written before its checkpoint, so a
        # save between the two reads (the other rank may finish a step) cannot make the count
        # negative, as the reverse order could
        saved = torch.load(run / 'ckpt.pt', weights_only=False)['step']
        redone.append(logged() - saved)
        before = os.stat(log).st_ino
        proc.send_signal(signal.SIGCONT)
    wait_until(lambda: logged() >= 20, proc, 'step 20')
    proc.send_signal(signal.SIGTERM)  # torchrun passes it on: every rank saves its step
    out, _ = proc.communicate(timeout=300)
    print(f'steps redone per kill: {redone}')  # shown with pytest -s
    stopped = torch.load(run / 'ckpt.pt', weights_only=False)['step']
    assert out.count('init_from=auto: resuming '
                     'from') == 2 and all(0 <= n <= 4 for n in redone), (redone, out)
    assert f'stopped by SIGTERM: saved {run / "ckpt.pt"} at step {stopped}' in out, out
    result = subprocess.run([*launch, 'train.py', *tiny_args(data_dir, ref, *args,
                                                             f'--max_iters={stopped}')],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    a, b = (torch.load(d / 'ckpt.pt', weights_only=False) for d in (run, ref))
    assert a['step'] == b['step'] == stopped >= 20 and a['model'].keys() == b['model'].keys()
    # bit-identical
    assert all(torch.equal(a['model'][name], b['model'][name]) for name in b['model'])
    assert [r['step'] for r in metrics(run)] == list(range(1, stopped + 1))
    assert [r['loss'] for r in metrics(run)] == [r['loss'] for r in metrics(ref)]


def test_the_console_line_gives_the_time_left(tmp_path, capsys):
    """Issue 53: train.py's log line had no ETA (under load, 8 minutes between lines). Now each ends
    with the time left at the pace of the steps since the line before: 90 steps at 2 s a step."""
    from types import SimpleNamespace
    c = dict(out_dir=str(tmp_path), max_iters=100, log_interval=10, wandb_project=None,
             wandb_run_name=None)
    metrics = train.Metrics(c, SimpleNamespace(master=True), 0)
    for step in range(1, 11):
        metrics.write(dict(step=step, loss=1.0, lr=1e-3, grad_norm=1.0, tokens_per_sec=100.0,
                           mfu=0.0, dt=1.0 if step < 6 else 3.0))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith('step 10/100 | loss 1.0000') and line.endswith('| 3000 ms | ETA 3m00s')
