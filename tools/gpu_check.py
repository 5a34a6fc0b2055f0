"""
The GPU acceptance run: one command that validates a machine end to end before a run of a day or
more, each check PASS or FAIL (or a report), then one Markdown table, with the same rows in a JSON
file written as they are measured (--check_json). No network; exit status 1 if a pass/fail check
failed; a stop (Ctrl-C, SIGTERM, SIGHUP) is a row "stopped", not a failure, and the table of what
ran, with exit status 128 + the signal's number. Parts: kernels and torchrun, and on a GPU ddp,
variants, kd and mfu (docs/benchmarks.md).

    python -m tools.gpu_check                          # every part this machine can run
    python -m tools.gpu_check --check_parts=torchrun   # some parts
    python -m tools.bench --check                      # the same run: tools/bench.py hands it over
"""
import gc
import importlib.util
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types

if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m tools.gpu_check")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from lmkit.checkpoint import read_checkpoint
from lmkit.distributed import autocast, compile_layers, wrap_ddp
from lmkit.measure import KNOWN_PEAK_BF16, flops_per_token, gemm_shapes, measured_matmul_flops
from configurator import Key, parse
from tools.tables import log, print_table, ratio
from lmkit.data import Windows
from tools.builtin_data import prepare_builtin
from lmkit.errors import RunError, Stopped, run_script
from lmkit.files import read_log, write_json
from lmkit.memory_plan import KNOWN_TEACHERS, memory_estimate
from distill import compute_loss, load_teacher
from model import ATTENTIONS, BASELINE, FIELD_NAMES, GPT, MODEL_SHAPES, ModelConfig
from lmkit.runs import configure_optimizers, load_config, run_config
from tools.memory_measure import PeakMemory
from tools.workloads import EXPLICIT, PROPOSED, kd_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
ONE_B_CONFIG = os.path.join(ROOT, 'config', 'affine_1b.py')
# NVIDIA H100 SXM datasheet, dense bf16: what nanochat's MFU uses
H100_BF16_PEAK = KNOWN_PEAK_BF16['H100']
# The ceiling on a variant's 1B training step, as a multiple of softmax's, by its key in
# model.VARIANTS. A variant without an entry, and any variant with a gate, is timed with no ceiling.
CHECK_TIME = {'sink': 1.05, 'affine': 1.03, 'softmax1': 1.05}


def holds_mfu_target(gpu_name):
    """Whether the mfu part holds a GPU to its MFU target: the GPUs of the H100 SXM's dense bf16
    peak (lmkit.measure.KNOWN_PEAK_BF16: H100 SXM, H200; not the H100 PCIe, 756 TFLOP/s), over which
    the MFU is taken."""
    return next((peak for key, peak in KNOWN_PEAK_BF16.items() if key in gpu_name),
                None) == H100_BF16_PEAK


def is_check_record(path):
    """Whether path holds a JSON record that this check wrote."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {'device', 'torch', 'rows'} <= set(record)


class Check:
    """The rows of the table; every row is also appended to the JSON file as soon as it is measured,
    so a run that is cut short keeps what it measured. ok: True / False for a pass-fail check, None
    for a report."""

    def __init__(self, json_path, header):
        if os.path.exists(json_path) and not is_check_record(json_path):
            raise RunError(f"--check_json={json_path}: holds something else than an earlier "
                           "--check record, which this run would write over; give another path")
        self.json_path, self.record = json_path, dict(header, rows=[])
        os.makedirs(os.path.dirname(json_path) or '.', exist_ok=True)
        self.save()

    def add(self, section, check, ok, value, target='', **data):
        self.record['rows'].append(dict(section=section, check=check, ok=ok, value=value,
                                        target=target, **data))
        self.save()
        log(f'  [{ {True: "PASS", False: "FAIL", None: "info"}[ok]}] {section}: {check}: {value}')

    def stopped(self, part, stop):
        """The row of a part a stop cut short: the machine did not fail it, the check was stopped,
        and the record says so (its 'stopped': the signal's words)."""
        self.record['stopped'] = str(stop)
        self.record['rows'].append(dict(section=part, check='ran to the end', ok=None,
                                        value=f'{stop}: this part and those after it did not run',
                                        target='', stopped=True))
        self.save()
        log(f'  [stopped] {part}: {stop}')

    def save(self):
        write_json(self.json_path, self.record)

    def failed(self):
        return [r for r in self.record['rows'] if r['ok'] is False]

    def print(self):
        rows = [[r['section'], r['check'],
                 'stopped' if r.get('stopped') else {True: 'pass', False: '**FAIL**',
                                                     None: '-'}[r['ok']],
                 str(r['value']), str(r['target'])] for r in self.record['rows']]
        print_table(f"tools/gpu_check.py on {self.record['device']}",
                    f"torch {self.record['torch']}; {len(self.failed())} failed of "
                    f"{sum(r['ok'] is not None for r in self.record['rows'])} pass/fail checks; "
                    f"JSON: {self.json_path}",
                    ['section', 'check', 'result', 'measured', 'target'], rows)


def last_line(run):
    """The last line a finished subprocess printed: on stdout, else on stderr (where a crash before
    any output goes)."""
    return (run.stdout.strip().splitlines() or run.stderr.strip().splitlines() or ['no output'])[-1]


# (test file, pytest -k expression) of the kernel tests, on CUDA and on CPU
KERNEL_TESTS = dict(cuda=[('tests/test_model.py', 'cuda'),
                          ('tests/test_distill.py',
                           'fused_kd_loss_in_training_precision and cuda')],
                    cpu=[('tests/test_model.py', 'explicit_reference and float32 and not cuda'),
                         ('tests/test_distill.py', 'fused_kd_loss_in_training_precision and cpu')])


def check_kernel_tests(check, device):
    """The test suite's fast-path-vs-float64-reference tests, run by pytest: on CUDA the CUDA ones
    (every variant forward and backward, bf16 and fp32, with GQA; grouped K/V reaching the kernels;
    fp32 GQA memory; the KD loss in training precision), on CPU the float32 attention references and
    the KD loss in training precision."""
    suites = KERNEL_TESTS['cuda' if device.type == 'cuda' else 'cpu']
    pytest = subprocess.run([sys.executable, '-m', 'pytest', '--version'], cwd=ROOT,
                            capture_output=True, text=True)
    # requirements.txt alone installs no pytest (and pytest >= 8.4 needs pygments)
    if pytest.returncode:
        check.add('kernels', 'the kernel tests (pytest)', None,
                  f'skipped: pytest does not run here ({last_line(pytest)}); pip install -r '
                  'requirements-test.txt',
                  'all pass')
        return
    for path, expression in suites:
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', path,
                              '-k', expression],
                             cwd=ROOT, capture_output=True, text=True)
        summary = last_line(run)
        passed = re.search(r'(\d+) passed', summary)
        ok = run.returncode == 0 and passed is not None
        check.add('kernels', f'{path} -k "{expression}"', ok,
                  f'{summary} ({time.perf_counter() - t0:.0f} s)',
                  'all pass', output=None if ok else run.stdout[-4000:] + run.stderr[-2000:])


def train_step_fn(model, step_model, idx, device):
    def step():
        model.zero_grad(set_to_none=True)
        with autocast(device):
            _, loss = step_model(idx[:, :-1], idx[:, 1:])
        loss.backward()
    return step


def time_cuda(fn, steps):
    """Median seconds of `steps` calls after one warm-up, timed with CUDA events."""
    fn()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def free_cuda():
    """Memory and compiled graphs of the models just measured released. A fresh dynamo cache for the
    next model: one shared with the last models would count their graphs towards its recompile limit
    (8), which this check, raising it, once hid a per-layer recompilation behind."""
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def dynamo_events():
    """(graphs dynamo compiled, graph breaks) in this process so far."""
    return counters['stats']['unique_graphs'], sum(counters['graph_break'].values())


def add_compile_row(check, section, what, before, first, timed):
    """A row for a compiled step from dynamo_events() before its first run, after it, and after the
    timed runs: it compiles at its first run only, and breaks no graph."""
    recompiles, breaks = timed[0] - first[0], timed[1] - before[1]
    check.add(section, f'{what}: compiled at the first step only, no graph '
                       'break', recompiles == breaks == 0,
              f'{first[0] - before[0]} graphs at the first step; then {recompiles} more, {breaks} '
              'graph breaks',
              'none after the first step; no graph break')


def ddp_gradient_copies(ddp):
    """How many gradient storages a DDP-wrapped model holds beside DDP's all-reduce buckets: 0 when
    every .grad is a view into a bucket (distributed.wrap_ddp), also after no_sync micro-steps,
    which otherwise give each parameter a gradient of its own: a second copy of every gradient (4.6
    GiB at 1B) until the synchronising micro-step."""
    buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    return len({p.grad.untyped_storage().data_ptr() for p in ddp.parameters()
                if p.grad is not None}) - buckets


def check_ddp(check, device, workdir):
    """distributed.wrap_ddp on this device (a one-rank process group): after a no_sync micro-step
    (the first of two, as in train.py's loop), every gradient is a view into DDP's all-reduce
    buckets, none a second copy beside them (ddp_gradient_copies)."""
    dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo',
                            init_method=f"file://{os.path.join(workdir, 'ddp_init')}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        config = ModelConfig(**MODEL_SHAPES['tiny'])
        with torch.device(device):
            model = GPT(config)
            x = torch.randint(0, config.vocab_size, (2, config.block_size + 1))
        ddp = wrap_ddp(model, device)
        with ddp.no_sync():
            with autocast(device):
                loss = compute_loss(ddp, model, None, x[:, :-1], x[:, 1:])[0]
            (loss / 2).backward()
        copies = ddp_gradient_copies(ddp)
    finally:
        dist.destroy_process_group()
    check.add('DDP', 'gradients kept once: views into the buckets after a no_sync '
                     'micro-step', copies == 0,
              f'{copies} gradient storages beside the buckets', '0')


def check_variants(check, device, args):
    """One training step (forward + backward) of every variant at the 1B shape of
    config/affine_1b.py, T = 2048, bf16 autocast, decoder layers compiled as train.py compiles them;
    vs softmax and vs Eq. 6 with an explicit T x T matrix. One variant in memory at a time (a 1B
    model with its gradients is 10 GB)."""
    run = run_config(load_config([ONE_B_CONFIG]))
    shape = {key: getattr(run, key) for key in FIELD_NAMES}
    B, T = args.check_batch_size, shape['block_size']
    results = {}
    for variant in (*ATTENTIONS, EXPLICIT):
        torch.manual_seed(0)
        model = step = None
        try:
            with torch.device(device):  # initialised on the GPU: seconds, not a minute of CPU
                model = GPT(ModelConfig(**shape | dict(attention=variant.split(' ')[0])))
            if variant == EXPLICIT:
                for layer in model.model.layers:
                    layer.self_attn.explicit = True
            compile_layers(model)
            idx = torch.randint(0, shape['vocab_size'], (B, T + 1), device=device)
            step = train_step_fn(model, model, idx, device)
            t0, before = time.perf_counter(), dynamo_events()
            step()  # compilation
            compile_s, first = time.perf_counter() - t0, dynamo_events()
            seconds = time_cuda(step, args.steps)
            with PeakMemory(device) as mem:
                step()
            results[variant] = (seconds, mem.peak, (before, first, dynamo_events()))
            log(f'  variants: {variant:<24} {seconds * 1e3:8.1f} ms  {mem.peak / 2**30:6.2f} GiB  '
                f'(compile {compile_s:.0f} s)')
        except torch.OutOfMemoryError:
            results[variant] = None
            log(f'  variants: {variant:<24} out of memory at batch {B}')
        del model, step
        free_cuda()
    base = results[BASELINE]
    for variant, result in results.items():
        if result is None:
            check.add('variants (1B, T=2048)', f'{variant}: step', variant == EXPLICIT and None,
                      f'out of memory at batch {B}')
            continue
        seconds, peak, events = result
        time_ratio, mem_ratio = seconds / base[0], peak / base[1] if base[1] else math.nan
        config = ModelConfig(attention=variant.split(' ')[0])
        limit = (None if variant == EXPLICIT or config.is_gated
                 else CHECK_TIME.get(config.variant_name))
        check.add('variants (1B, T=2048)', f'{variant}: fwd+bwd, batch {B}',
                  None if limit is None else time_ratio <= limit,
                  f'{seconds * 1e3:.1f} ms ({time_ratio:.3f}x softmax), peak {peak / 2**30:.2f} '
                  f'GiB ({mem_ratio:.2f}x)', f'<= {limit}x softmax' if limit else '',
                  seconds=seconds, peak_bytes=peak)
        add_compile_row(check, 'variants (1B, T=2048)', variant, *events)
    if results.get(EXPLICIT) and results.get(PROPOSED):
        check.add('variants (1B, T=2048)', f'{PROPOSED} O(T) vs explicit T x T {PROPOSED}', None,
                  f'{ratio(results[PROPOSED][0], results[EXPLICIT][0])}x the time, '
                  f'{ratio(results[PROPOSED][1], results[EXPLICIT][1])}x the peak memory')


def check_kd(check, device, args):
    """fused_kd_loss vs the naive bf16 KD (both models' full bf16 logits, log-softmax in fp32) at V
    = 128,256, in the dtypes of a DDP bf16 run (student hidden states and lm_head fp32 under
    autocast, teacher's bf16): forward + backward, median time and peak memory."""
    N, V = args.kd_tokens, 128256
    # Llama-3.2-1B and -3B widths
    h_s, w_s, paths = kd_problem(N, V, 2048, 3072, device, torch.float32)
    results = {}
    for name, step in paths.items():
        try:
            seconds = time_cuda(step, 5)
            # freed before the measurement: the step's own gradients count in its peak
            h_s.grad = w_s.grad = None
            with PeakMemory(device) as mem:
                loss = step()
            results[name] = (seconds, mem.peak, loss.item(), h_s.grad.clone(), w_s.grad.clone())
        except torch.OutOfMemoryError:
            results[name] = None
        free_cuda()
    fused, base = results['fused_kd_loss'], results['naive']
    if base is None:
        check.add('KD loss (V=128,256)', 'naive bf16 KD', None, f'out of memory with {N} tokens')
        return
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    agree = (abs(fused[2] - base[2]) / abs(base[2]) < 1e-2 and rel(fused[3], base[3]) < 2e-2
             and rel(fused[4], base[4]) < 2e-2)
    check.add('KD loss (V=128,256)', f'fused vs naive bf16: value and gradients agree, {N} '
                                     'tokens', agree,
              f'loss {fused[2]:.5f} vs {base[2]:.5f}; grad rel. diff h '
              f'{rel(fused[3], base[3]):.1e}, W '
              f'{rel(fused[4], base[4]):.1e}', 'within bf16 rounding (1e-2, 2e-2)')
    check.add('KD loss (V=128,256)', 'fused time vs naive bf16', fused[0] <= base[0],
              f'{fused[0] * 1e3:.1f} ms vs {base[0] * 1e3:.1f} ms '
              f'({fused[0] / base[0]:.2f}x)', '<= 1.00x')
    check.add('KD loss (V=128,256)', 'fused peak memory vs naive bf16', fused[1] <= 0.15 * base[1],
              f'{fused[1] / 2**30:.2f} GiB vs {base[1] / 2**30:.2f} GiB '
              f'({fused[1] / base[1]:.3f}x)', '<= 0.15x')


def check_torchrun(check, device, args, workdir):
    """train.py under torchrun on one device, with a KD teacher, for each variant at once (small
    models): a DDP run stopped by SIGTERM, resumed under FSDP, both compiled on CUDA. Checks: the
    signal saves the step reached, the resumed run continues from it and the loss curve continues,
    the loss falls, and the checkpoint loads on CPU."""
    cuda = device.type == 'cuda'
    # on CPU: the plumbing of one variant, in seconds
    variants = ATTENTIONS if cuda else (PROPOSED,)
    # prepare_data.py reads even the built-in corpus through it
    if importlib.util.find_spec('datasets') is None:
        check.add('torchrun', 'train.py under torchrun', None,
                  'skipped: prepare_data.py needs the datasets package (pip install -r '
                  'requirements.txt)', 'every variant runs')
        return
    data = os.path.join(workdir, 'data')
    prepare_builtin(data)
    common = ['--n_layer=2', '--n_head=4', '--n_kv_head=2', '--n_embd=64',
              '--intermediate_size=128',
              '--vocab_size=320', '--block_size=64', '--global_batch_size=16',
              '--micro_batch_size=8',
              '--warmup_iters=5', '--learning_rate=3e-3', '--decay_frac=0.0', '--eval_batches=2',
              '--log_interval=1000',
              '--peak_flops=1e12', f'--device={device.type}', f'--data_dir={data}']
    # a teacher worth distilling: 60 steps of cross-entropy
    teacher = os.path.join(workdir, 'teacher')
    subprocess.run([sys.executable, 'train.py', *common, '--max_iters=60', '--eval_interval=60',
                    '--compile=False',
                    f'--out_dir={teacher}'], cwd=ROOT, check=True, capture_output=True)
    kd = [f'--teacher={teacher}', '--eval_interval=10', f'--compile={cuda}']
    stop_after = 12
    outputs = stop_runs({v: torchrun_train(ROOT, *common, *kd, f'--attention={v}',
                                           '--max_iters=100000',
                                           f'--out_dir={os.path.join(workdir, v)}')
                         for v in variants},
                        workdir, stop_after)
    resumed = {}
    for v in variants:
        out_dir = os.path.join(workdir, v)
        ckpt = os.path.join(out_dir, 'ckpt.pt')
        stopped = read_checkpoint(ckpt, keys=('step',))['step'] if os.path.exists(ckpt) else 0
        saved = (stopped >= stop_after and len(metrics_records(out_dir)) == stopped
                 and 'stopped by SIGTERM: saved' in outputs.get(v, ''))
        check.add('torchrun', f'{v}: DDP run, SIGTERM saves the step reached', saved,
                  f'stopped at step {stopped}, {len(metrics_records(out_dir))} '
                  'records', f'>= {stop_after}',
                  output=None if saved else outputs.get(v, 'timed out')[-3000:])
        if saved:
            resumed[v] = (stopped,
                          torchrun_train(ROOT, *common, *kd, f'--attention={v}',
                                         f'--max_iters={stopped + 10}',
                                         '--fsdp=True', '--init_from=resume',
                                         f'--out_dir={out_dir}'))
    for v, (stopped, proc) in resumed.items():
        check_resumed_run(check, device, data, os.path.join(workdir, v), v, stopped, proc)


def torchrun_train(root, *flags):
    """train.py with these flags under torchrun (one process), started in root; its stdout and
    stderr piped."""
    return subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                             '--nproc_per_node=1',
                             'train.py', *flags], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def metrics_records(out_dir):
    """The records of a run's metrics.jsonl so far ([] before its first)."""
    # read while the run appends: a line being written is left out
    path = os.path.join(out_dir, 'metrics.jsonl')
    return read_log(path) if os.path.exists(path) else []


def stop_runs(runs, workdir, stop_after):
    """SIGTERM to each run (variant -> its torchrun process, writing to workdir/variant) once it has
    logged stop_after steps or has exited; returns variant -> its output. Runs still going after 300
    s are killed, and left out."""
    deadline, outputs = time.time() + 300, {}
    while runs and time.time() < deadline:
        for v, proc in list(runs.items()):
            if len(metrics_records(os.path.join(workdir,
                                                v))) >= stop_after or proc.poll() is not None:
                proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its worker
                outputs[v] = proc.communicate(timeout=300)[0]
                del runs[v]
        time.sleep(0.2)
    for proc in runs.values():
        proc.kill()
    return outputs


def check_resumed_run(check, device, data, out_dir, variant, stopped, proc):
    """The rows of a variant's run resumed under FSDP from step `stopped` (proc, writing to
    out_dir): it continues the run and its loss curve, its KD loss falls, and its checkpoint loads
    on CPU."""
    out = proc.communicate(timeout=600)[0]
    losses = [r['loss'] for r in metrics_records(out_dir)]
    steps = [r['step'] for r in metrics_records(out_dir)]
    continued = proc.returncode == 0 and steps == list(range(1, stopped + 11))
    # the curve continues: the first resumed loss is nearer the last losses before the stop than the
    # first ones
    before = losses[stopped - 3:stopped]
    jump = abs(losses[stopped] - sum(before) / 3) if continued else math.inf
    fell = losses[0] - (sum(losses[-3:]) / 3) if continued else -math.inf
    check.add('torchrun', f'{variant}: FSDP resume continues the '
                          'run', continued and jump < 0.25 * fell,
              f'steps {stopped + 1}-{stopped + 10}; loss {losses[stopped - 1]:.3f} -> '
              f'{losses[stopped]:.3f} across the '
              'restart' if continued else f'exit {proc.returncode}', 'jump < 1/4 of the fall',
              output=None if continued else out[-3000:])
    check.add('torchrun', f'{variant}: KD loss falls', continued and fell > 0.3,
              f'{losses[0]:.3f} -> {sum(losses[-3:]) / 3:.3f}' if continued else '-',
              'falls by > 0.3')
    if continued:
        model = load_teacher(out_dir, 'cpu')  # our checkpoint, on CPU, in float32
        windows = Windows(data, 'val', model.config.block_size)
        x, y = (torch.from_numpy(t) for t in windows.get(range(2 * 8)))
        with torch.no_grad():
            _, loss = model(x, y)
        logged = metrics_records(out_dir)[-1]['val_loss']
        check.add('torchrun', f'{variant}: checkpoint loads on '
                              'CPU', abs(loss.item() - logged) < 0.05,
                  f'CPU float32 val loss {loss.item():.4f}, logged on {device.type} {logged:.4f}',
                  'within 0.05 (bf16)')


def check_mfu(check, device, args):
    """Tokens/s and MFU of config/affine_1b.py's step (train.py's micro-steps: compute_loss and
    backward; clipping, AdamW; layers compiled) with a 3B-shaped teacher (Llama-3.2-3B's published
    shape, random bf16 weights), one GPU, at the largest micro-batch the memory plan lets fit."""
    run = run_config(load_config([ONE_B_CONFIG]))
    shape = {key: getattr(run, key) for key in FIELD_NAMES}
    cfg, T = ModelConfig(**shape), shape['block_size']
    # MODEL_SHAPES' llama3.2-3b
    teacher_cfg = ModelConfig(**KNOWN_TEACHERS['Llama-3.2-3B'] | dict(block_size=T))
    gpu = torch.cuda.get_device_properties(device).total_memory
    fits = [b for b in (16, 12, 8, 6, 4, 2, 1)
            if sum(memory_estimate(cfg, 1, b, 'bfloat16', False, False,
                                   teacher_cfg).values()) <= 0.92 * gpu]
    torch.manual_seed(0)
    baseline = torch.cuda.memory_allocated(device)  # what earlier parts left: not this step's
    with torch.device(device):
        student = GPT(cfg)
        teacher = GPT(teacher_cfg).to(torch.bfloat16).eval().requires_grad_(False)
    compile_layers(student)
    compile_layers(teacher)
    optimizer = configure_optimizers(student, 0.1, 1e-4, (0.9, 0.95))
    accumulation = 2
    # teacher: forward only
    step_flops = flops_per_token(student, T) + flops_per_token(teacher, T) / 3
    for B in fits:
        batches = [(x[:, :-1], x[:, 1:])
                   for x in (torch.randint(0, cfg.vocab_size, (B, T + 1), device=device)
                             for _ in range(accumulation))]

        def step():
            for x, y in batches:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = compute_loss(student, student, teacher, x, y)[0]  # fused, T = 1, pure KD
                (loss / accumulation).backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            student.update_alpha_ma()

        try:
            t0, before = time.perf_counter(), dynamo_events()
            step()
            compile_s, first = time.perf_counter() - t0, dynamo_events()
            torch.cuda.reset_peak_memory_stats()
            seconds = time_cuda(step, args.steps)
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            free_cuda()
            log(f'  mfu: micro-batch {B} out of memory')
            continue
        section = '1B affine KD step, 3B teacher'
        peak = torch.cuda.max_memory_allocated(device) - baseline
        tokens = accumulation * B * T / seconds
        mfu = step_flops * tokens / H100_BF16_PEAK
        measured_peak = measured_matmul_flops(device, torch.bfloat16, gemm_shapes(student, B * T))
        check.add(section, f'micro-batch {B} x {T}, {accumulation} micro-steps + AdamW',
                  mfu >= 0.45 if holds_mfu_target(torch.cuda.get_device_name(device)) else None,
                  f'{tokens:,.0f} tokens/s, MFU {100 * mfu:.1f}% of 989 TFLOP/s '
                  f'({100 * step_flops * tokens / measured_peak:.1f}% '
                  f'of the measured {measured_peak / 1e12:.0f}); peak {peak / 2**30:.1f} GiB; '
                  f'compile {compile_s:.0f} s', '>= 45% MFU (H100, H200)', tokens_per_sec=tokens,
                  mfu=mfu, step_seconds=seconds, micro_batch=B)
        # the dry run's plan for this step: one GPU (DDP's per-GPU memory does not depend on the
        # ranks)
        plan = sum(memory_estimate(cfg, 1, B, 'bfloat16', False, False, teacher_cfg).values())
        check.add(section, 'peak memory vs the dry run\'s plan (memory_plan.memory_estimate)',
                  peak <= plan, f'{peak / 2**30:.1f} GiB allocated at the peak, plan '
                  f'{plan / 2**30:.1f} GiB ({peak / plan:.2f}x)', '<= the plan', peak_bytes=peak,
                  plan_bytes=plan)
        add_compile_row(check, section, 'student and teacher layers', before, first,
                        dynamo_events())
        if cfg.variant.fp32:  # the variant's float32 buffers (affine's alpha_ma)
            dtypes = {getattr(layer.self_attn, name).dtype for layer in student.model.layers
                      for name in cfg.variant.fp32}
            check.add(section, f"{', '.join(cfg.variant.fp32)} after bf16 "
                               "steps", dtypes == {torch.float32},
                      ', '.join(sorted(str(d) for d in dtypes)), 'torch.float32')
        return
    check.add('1B affine KD step, 3B teacher', 'a micro-batch that fits', False,
              f'none of {fits} fit')


def run_parts(check, parts, args, cuda):
    """Each part of (name, function) that --check_parts asks for, in order; a part that raises is a
    failed row, and the others still run. A stop ends the parts with a "stopped" row, returned."""
    part = 'the start'
    try:
        for part, fn in parts:
            if args.check_parts and part not in args.check_parts:
                continue
            t0 = time.perf_counter()
            log(f'{part} ...')
            try:
                fn()
            except Stopped:
                raise
            except Exception as e:  # a broken part is a failed row, and the other parts still run
                check.add(part, 'ran to the end', False, f'{type(e).__name__}: {e}'[:300],
                          output=traceback.format_exc()[-4000:])
            log(f'{part}: {time.perf_counter() - t0:.0f} s')
            if cuda:
                free_cuda()
    except Stopped as stop:  # (also between parts) the machine did not fail: the check was stopped
        check.stopped(part, stop)
        return stop.again(f"{stop} in the {part} part: what ran before it is in the table above "
                          f"and in {check.json_path}")
    return None


def run_check(args):
    """The parts above (--check_parts: some of them), one table at the end, the JSON as it goes.
    Exit status 1 if a pass/fail check failed; 0 on a machine without a GPU after the CPU parts; a
    stop: the table of what ran, then the stop raised."""
    cuda = torch.cuda.is_available()
    device = torch.device('cuda' if cuda else 'cpu')
    name = (torch.cuda.get_device_name(device) if cuda else f'CPU ({torch.get_num_threads()} '
                                                            'threads), no GPU')
    check = Check(args.check_json,
                  dict(device=name, torch=torch.__version__, date=time.strftime('%Y-%m-%d %H:%M')))
    log(f'tools/gpu_check.py on {name}, torch {torch.__version__}')
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        parts = [('kernels', lambda: check_kernel_tests(check, device)),
                 ('torchrun', lambda: check_torchrun(check, device, args, workdir))]
        if cuda:
            parts += [('ddp',
                       lambda: check_ddp(check, torch.device('cuda', torch.cuda.current_device()),
                                         workdir)),
                      ('variants', lambda: check_variants(check, device, args)),
                      ('kd', lambda: check_kd(check, device, args)),
                      ('mfu', lambda: check_mfu(check, device, args))]
        stop = run_parts(check, parts, args, cuda)
    if not cuda and not stop:
        check.add('GPU', 'CUDA device', None,
                  'none found: the GPU sections (DDP gradients, variants at 1B, KD at V=128,256, '
                  'MFU with the memory plan) were skipped', 'a GPU')
    check.record['seconds'] = time.perf_counter() - t_start
    check.save()
    check.print()
    if stop:
        raise stop
    return 1 if check.failed() else 0


CHECK_PARTS = ('kernels', 'torchrun', 'ddp', 'variants', 'kd', 'mfu')

# tools/bench.py --check hands these over (bench.CHECK_KEYS): the flags keep their names there and
# here
KEYS = dict(
    check_json=Key('out/bench_check.json',
                   'where the JSON record goes (its folder is made if missing)'),
    check_parts=Key(None, 'only these parts; default all', choices=CHECK_PARTS, types=(list,)),
    check_batch_size=Key(4, 'micro-batch of the 1B variant steps', min=1),
    steps=Key(7, 'timed steps per measured step (median)', min=1),
    kd_tokens=Key(8192, 'tokens of the kd part', min=1),
)


def parse_args(argv):
    return types.SimpleNamespace(**parse(argv, KEYS, __doc__, prog='python -m tools.gpu_check'))


def main(argv=None):
    return run_check(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == '__main__':
    sys.exit(run_script(main))
