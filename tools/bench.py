"""Benchmarks, side by side in one run on whatever device is found; timings are reports, never
pass/fail. Sections (docs/benchmarks.md): attention (each variant's step vs softmax and vs the
explicit T x T affine), kd (fused vs naive), train (tokens/s, MFU), eval (batched vs one by one),
harness (vs lm-evaluation-harness 0.4.9), study (the sink study's runs vs a plain loop), threads,
tokenizer (prepare_data.py with the tiktoken rebuild vs `tokenizers`).

    python -m tools.bench                                        # every section at the sizes below
    python -m tools.bench --sections=attention,train --steps=7   # some sections
    python -m tools.bench --sections=kd --kd_tokens=1024 --kd_hidden=512   # KD in ~2.5 GiB, not ~20
    python -m tools.bench --check   # the GPU acceptance run, pass/fail: tools/gpu_check.py
"""
import dataclasses
import ctypes
import glob
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types

if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m tools.bench")

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch

from lmkit.progress import Progress
from lmkit.measure import default_peak_flops, flops_per_token, gemm_shapes, measured_matmul_flops
from tools.builtin_data import prepare_builtin
from lmkit.distributed import autocast, compile_layers, resolve_device
from configurator import DEVICE, Key, parse, shown
from lmkit.errors import RunError, run_script
from lmkit.files import read_log
from lmkit.zeroshot import build_docs, choice_doc, encode_docs, score_one_by_one, score_requests
from lmkit.loading import load_model_and_tokenizer
from model import ATTENTIONS, BASELINE, FIELD_NAMES, GPT, ModelConfig
from lmkit.inspection import hooked_forward, inspect_attention, mean_attention_logit
from lmkit.probes import (SINK_STUDY_EVALUATIONS, VALUE_WEIGHTED_STRIDE, activation_outliers,
                          alpha_summary, first_token_weights, sink_record, sink_scores,
                          value_weighted_first_token, variant_statistics, weight_rows)
from lmkit.sink_costs import GU_LENGTH, GU_SAMPLES, knockout_losses, sink_rates, w8a8_losses
from lmkit.tokenizer import load_tokenizer
from lmkit.runs import configure_optimizers, load_config, run_config
from tools.harness_tasks import task_rows, write_harness_yamls, write_tasks
from tools.memory_measure import PeakMemory
from tools.tables import log, print_table, ratio
from tools.tokenizer_bench import bench_tokenizer
from tools.workloads import EXPLICIT, PROPOSED, kd_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
TINY_CONFIG = os.path.join(ROOT, 'config', 'tiny_cpu.py')

# -----------------------------------------------------------------------------
# Measuring


def set_mmap_threshold(n_bytes):
    """glibc's mmap threshold, fixed (which also stops its adjustment). The memory sections set it
    low: glibc would otherwise raise it after the first big free and keep later tensors on the heap,
    where freeing them need not lower the resident size, so on CPU the resident set follows the live
    tensors and its peak measures theirs. The timing sections set it to the dynamic threshold's
    ceiling (32 MiB), close to what a normal run settles at, so that their large allocations are not
    each a fresh mmap."""
    if sys.platform == 'linux':
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, n_bytes)  # -3: M_MMAP_THRESHOLD
        libc.malloc_trim(0)  # what earlier sections freed onto the heap goes back to the kernel


def available_memory(device):
    """Bytes that can still be allocated: free GPU memory, or the kernel's MemAvailable estimate."""
    if device.type == 'cuda':
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    return int(re.search(r'MemAvailable:\s+(\d+)', open('/proc/meminfo').read()).group(1)) * 1024


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def dtype_name(device):
    return 'bf16 autocast' if device.type == 'cuda' else 'float32'


def mib(n_bytes):
    return f'{n_bytes / 2**20:.1f}'


def model_config(args, attention, block_size):
    """The model of the attention and train sections (SwiGLU width 8/3 n_embd, rounded down to
    64)."""
    return ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_kv_head,
                       n_embd=args.n_embd,
                       intermediate_size=args.n_embd * 8 // 3 // 64 * 64,
                       vocab_size=args.vocab_size, block_size=block_size, attention=attention)


def model_shape(args):
    return (f'n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head} '
            f'n_kv_head={args.n_kv_head} vocab={args.vocab_size}')

# -----------------------------------------------------------------------------
# attention: one training step per variant, vs softmax and vs the explicit T x T affine


def bench_attention(args, device):
    """Per sequence length: build every variant, then time them in interleaved rounds (one step of
    each per round, median over rounds), so drift in machine load hits all variants alike."""
    variants = list(ATTENTIONS) + [EXPLICIT]
    rows = []
    for T in args.seq_lens:
        steps = {}
        for variant in variants:
            torch.manual_seed(0)
            model = GPT(model_config(args, variant.split(' ')[0], T)).to(device)
            if variant == EXPLICIT:
                for layer in model.model.layers:
                    layer.self_attn.explicit = True
            step_model = compile_layers(model) if args.compile else model  # as train.py compiles
            idx = torch.randint(0, args.vocab_size, (args.batch_size, T), device=device)

            def step(model=model, step_model=step_model, idx=idx):
                model.zero_grad(set_to_none=True)
                with autocast(device):
                    _, loss = step_model(idx, idx)
                loss.backward()
                synchronize(device)
                model.zero_grad(set_to_none=True)

            step()  # warm-up (and compilation)
            steps[variant] = step
        times = {v: [] for v in variants}
        for _ in range(args.steps):
            for variant in variants:
                t0 = time.perf_counter()
                steps[variant]()
                times[variant].append(time.perf_counter() - t0)
        measured = []
        for variant in variants:
            with PeakMemory(device) as mem:
                steps[variant]()
            measured.append((variant, statistics.median(times[variant]), mem.peak))
            log(f'  attention: {variant:<24} T={T:<5} {measured[-1][1] * 1e3:9.1f} ms '
                f'{mib(mem.peak):>9} MiB')
        del steps
        _, base_time, base_mem = measured[0]  # softmax
        rows += [[v, str(T), f'{t * 1e3:.1f}', ratio(t, base_time), mib(m), ratio(m, base_mem)]
                 for v, t, m in measured]
    print_table('Attention variants: one training step (forward + backward)',
                f'Model {model_shape(args)}, batch {args.batch_size}; {dtype_name(device)}, '
                f'compile={args.compile}; median of {args.steps} interleaved rounds; peak memory '
                'of one step. Sink runs the LSE-corrected flash kernel on CPU and CUDA. '
                f'"{EXPLICIT}": Eq. 6 with the T x T matrix built explicitly.',
                ['variant', 'T', 'fwd+bwd (ms)', 'time / softmax', 'peak mem (MiB)',
                 'mem / softmax'],
                rows)

# -----------------------------------------------------------------------------
# kd: fused_kd_loss vs the naive full-logits KL


def bench_kd(args, device):
    """One forward + backward of pure KD (T = 1) per path, on random hidden states and lm_heads; in
    training dtypes on CUDA (bf16 hidden states and teacher head, float32 student head,
    autocast)."""
    N, V, C = args.kd_tokens, args.kd_vocab, args.kd_hidden
    h_s, w_s, paths = kd_problem(N, V, C, C, device, torch.bfloat16 if device.type == 'cuda'
                                 else torch.float32)
    # at its peak the naive path holds five N x V float32 tensors (the saved log-softmaxes and the
    # KL's terms, forward and backward alike): 19.57 GiB at the default sizes, where 19.58 GiB was
    # measured on CPU
    estimate, available = 5 * N * V * 4, available_memory(device)
    results = {}
    for name, step in paths.items():
        if name == 'naive' and estimate > available:
            log(f'  kd: naive skipped: it needs ~{estimate / 2**30:.1f} GiB, '
                f'{available / 2**30:.1f} GiB available')
            continue
        if device.type == 'cuda':
            step()  # warm-up: CUDA context, cuBLAS workspaces
        # freed before the measurement: the step's own gradients count in its peak
        h_s.grad = w_s.grad = None
        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            loss = step().item()  # .item() waits for the device
            seconds = time.perf_counter() - t0
        results[name] = (seconds, mem.peak, loss)
        log(f'  kd: {name:<14} {seconds:9.2f} s {mib(mem.peak):>9} MiB')
    base_time, base_mem, _ = results.get('naive', (0, 0, 0))
    rows = [[name, f'{t:.2f}', ratio(t, base_time), mib(m), ratio(m, base_mem), f'{loss:.6f}']
            for name, (t, m, loss) in results.items()]
    if 'naive' not in results:
        rows.insert(0,
                    ['naive', 'skipped: would not fit', '-', f'~{mib(estimate)} (estimate)', '-',
                     '-'])
    print_table(
        'KD loss: fused_kd_loss vs naive full logits',
        f'{N:,} tokens, V = {V:,}, hidden {C}; one forward + backward of KD (T = 1, pure KD); '
        f'{"bf16 hidden states and teacher head, autocast" if device.type == "cuda" else "float32"}'
        f', eager. Naive path estimated at {estimate / 2**30:.2f} GiB, '
        f'{available / 2**30:.1f} GiB available.',
        ['path', 'time (s)', 'time / naive', 'peak mem (MiB)', 'mem / naive', 'loss'], rows)

# -----------------------------------------------------------------------------
# train: tokens/s and MFU of real optimizer steps


def bench_train(args, device):
    """Forward, backward, AdamW step and alpha_ma update, on one fixed random batch (no data
    loading), after two warm-up steps (compilation, AdamW's state). MFU as train.py logs it
    (lmkit.measure.flops_per_token), over the measured matmul peak at the shapes of every variant's
    matmuls."""
    B, T = args.train_batch_size, args.train_seq_len
    dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32
    rows, shapes = [], set()
    for variant in args.variants:
        torch.manual_seed(0)
        model = GPT(model_config(args, variant, T)).to(device)
        optimizer = configure_optimizers(model, weight_decay=0.1, lr=1e-4, betas=(0.9, 0.95))
        step_model = compile_layers(model) if args.compile else model  # as train.py compiles
        x = torch.randint(0, args.vocab_size, (B, T + 1), device=device)

        def step():
            with autocast(device):
                _, loss = step_model(x[:, :-1], x[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.update_alpha_ma()

        for _ in range(2):
            step()
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(args.train_steps):
            step()
        synchronize(device)
        dt = (time.perf_counter() - t0) / args.train_steps
        rows.append((variant, model.get_num_params(), dt, flops_per_token(model, T) * B * T / dt))
        shapes |= set(gemm_shapes(model, B * T))
        log(f'  train: {variant:<14} {dt * 1e3:9.1f} ms/step {B * T / dt:10,.0f} tokens/s')
    peak = measured_matmul_flops(device, dtype, sorted(shapes))
    how = f": one thread's best x {torch.get_num_threads()} threads" if device.type == 'cpu' else ''
    note = (f'; the peak train.py uses for its MFU on this GPU is '
            f'{default_peak_flops(device, dtype, sorted(shapes)) / 1e12:.0f} TFLOP/s.'
            if device.type == 'cuda' else '.')
    rows = [[variant, f'{params:,}', f'{dt * 1e3:.1f}', f'{B * T / dt:,.0f}', f'{flops / 1e12:.3f}',
             f'{100 * flops / peak:.1f}%'] for variant, params, dt, flops in rows]
    print_table('Training throughput',
                f'Model {model_shape(args)}, batch {B} x {T} tokens, {args.train_steps} timed '
                f'AdamW steps; {dtype_name(device)}, compile={args.compile}. MFU = '
                'lmkit.measure.flops_per_token x tokens/s over the measured matmul peak at the '
                f'model\'s matmul shapes, {peak / 1e12:.2f} TFLOP/s '
                f'(lmkit.measure.measured_matmul_flops{how})' + note,
                ['variant', 'params', 'step (ms)', 'tokens/s', 'model TFLOP/s', 'MFU'], rows)

# -----------------------------------------------------------------------------------------------
# study: the sink study's runs (train.py as study/sink_study.py starts them) vs a plain PyTorch loop
# on the same shape

STUDY_CONFIG = os.path.join(ROOT, 'config', 'sink_study.py')


def plain_loop(config, steps, device, threads):
    """tokens/s of the loop the study is held to: the study's model and batch in a plain PyTorch
    loop, as one first writes it: AdamW over every parameter at one learning rate, batches sliced at
    random from a random token stream, eager, nothing else (no schedule, clipping, logging,
    evaluation or checkpoint), on `threads` threads. Median step after 5 warm-up."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{key: getattr(config, key) for key in FIELD_NAMES})).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    B, T = config.global_batch_size, config.block_size
    stream = torch.randint(0, config.vocab_size, (1_000_000,))
    times = []
    for _ in range(5 + steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, len(stream) - T - 1, (B,)).tolist()
        batch = torch.stack([stream[s:s + T + 1] for s in starts]).to(device)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(before)
    return B * T / statistics.median(times[5:])


def study_command(variant, steps, compile, data_dir, out_dir, device):
    """train.py as study/sink_study.py starts a run, for `steps` steps with the study's evaluations
    per run."""
    return [sys.executable, 'train.py', STUDY_CONFIG, f'--data_dir={data_dir}',
            f'--out_dir={out_dir}', f'--attention={variant}', f'--max_iters={steps}',
            f'--eval_interval={max(1, steps // SINK_STUDY_EVALUATIONS)}', f'--compile={compile}',
            f'--device={device}']


def study_runs(commands, threads, wait_policy=None):
    """Run train.py commands side by side, each with `threads` threads (and
    OMP_WAIT_POLICY=wait_policy where given; '': none, libgomp's own default); per run (median
    tokens/s of its steps after the first 5, as its metrics.jsonl records them; seconds outside the
    steps: start, compile, evaluations and checkpoints, from its wall time)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if wait_policy is not None:
        env['OMP_WAIT_POLICY'] = wait_policy
        if not wait_policy:
            del env['OMP_WAIT_POLICY']
    out_dirs = [next(a.partition('=')[2] for a in c if a.startswith('--out_dir='))
                for c in commands]
    outputs = [open(f'{d}.log', 'w') for d in out_dirs]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
             for c, output in zip(commands, outputs)]
    walls = {}
    while len(walls) < len(procs):
        walls |= {i: time.perf_counter() - t0 for i, p in enumerate(procs) if i not in walls
                  and p.poll() is not None}
        time.sleep(0.05)
    results = []
    for i, (command, proc, out_dir, output) in enumerate(zip(commands, procs, out_dirs, outputs)):
        output.close()
        if proc.returncode != 0:
            with open(output.name) as f:
                raise RunError(f"{shlex.join(command)} failed:\n{f.read()[-2000:]}")
        steps = [r for r in read_log(os.path.join(out_dir, 'metrics.jsonl'))
                 if 'tokens_per_sec' in r]
        results.append((statistics.median(r['tokens_per_sec'] for r in steps[5:] or steps),
                        walls[i] - sum(r['dt'] for r in steps)))
    return results


def bench_study(args, device):
    """Per variant: the plain loop, train.py eager, and train.py as the study runs it
    (config/sink_study.py: layers compiled); then the processes (the study's 2 one-thread runs side
    by side against one run on 2 threads) and what the attention statistics of its evaluations
    cost."""
    config = run_config(load_config([STUDY_CONFIG]))
    B, T, threads = config.global_batch_size, config.block_size, args.study_threads
    steps, full = args.study_steps, config.max_iters
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # the built-in corpus: throughput does not depend on which text it is
        data = os.path.join(tmp, 'data')
        prepare_builtin(data)
        run = lambda variant, compile, i=0: study_command(variant, steps, compile, data,
                                                         os.path.join(tmp,
                                                                      f'{variant}_{compile}_{i}'),
                                                          device)
        for variant in args.variants:
            plain = plain_loop(dataclasses.replace(config, attention=variant), steps, device,
                               threads)
            (eager, _), = study_runs([run(variant, False)], threads)
            (compiled, outside), = study_runs([run(variant, True)], threads)
            rows.append([variant, f'{plain:,.0f}', f'{eager:,.0f}', f'{compiled:,.0f}',
                         ratio(compiled, plain),
                         f'{outside:.0f}', f'{(outside + full * B * T / compiled) / 60:.1f}'])
            log(f'  study: {variant:<14} plain {plain:,.0f}, train.py eager {eager:,.0f}, compiled '
                f'{compiled:,.0f} tokens/s; {outside:.0f} s outside the steps')
        variant = args.variants[0]
        side = study_runs([run(variant, True, i) for i in range(2)], threads)
        (together, _), = study_runs([run(variant, True, 9)], 2 * threads)
        # the analysis passes: a run without the attention statistics at its evaluations, beside one
        # with them
        (_, without), (_,
                       with_stats) = study_runs([run(variant, True, 8) + ['--attention_windows=0'],
                                                 run(variant, True, 7)], threads)
        # the most that training k seeds as one batched model could gain: one model's tokens/s at k
        # times the batch (k seeds' weights stacked do at least the work of one model on k x the
        # batch, in no fewer kernels)
        batched = [study_runs([run(variant, True, 20 + k) + [f'--global_batch_size={k * B}',
                                                               f'--micro_batch_size={k * B}']],
                              threads)[0][0]
                   for k in (1, 2, 4)]
    print_table("The sink study's runs: train.py against a plain PyTorch loop",
                f"config/sink_study.py's model and batch ({B} x {T} tokens), {threads} thread(s) "
                f"per process, {steps} steps per run (tokens/s: the median step after the first "
                "5). Plain loop: bench.plain_loop, eager. train.py: the study's command (its data "
                "loading, schedule, clipping, logging, 8 evaluations with the attention "
                "statistics, checkpoints), eager and as the study runs it (layers compiled); "
                "'outside the steps': its seconds of start, compile, evaluations and checkpoints. "
                f"A study run of {full:,} steps: those seconds plus its steps at the compiled "
                "rate.",
                ['variant', 'plain loop tokens/s', 'train.py eager', 'train.py compiled',
                 'compiled / plain', 'outside the steps (s)', f'a {full:,}-step run (min)'], rows)
    print_table('Processes',
                f"{variant}, train.py compiled, {steps} steps: the study's way on a 2-core machine "
                f"(2 runs side by side, {threads} thread(s) each) against one run with "
                f"{2 * threads}. The attention statistics of the {SINK_STUDY_EVALUATIONS} "
                "evaluations (probes.sink_record, the study's analysis pass) cost "
                f"{with_stats - without:.1f} s of a run's {with_stats:.0f} s outside its steps "
                "(two runs side by side, one with --attention_windows=0)).",
                ['processes x threads', 'tokens/s per run', 'tokens/s in all'],
                [[f'2 x {threads}', ' '
                                    '/ '.join(f'{t:,.0f}' for t, _ in side),
                  f'{sum(t for t, _ in side):,.0f}'],
                 [f'1 x {2 * threads}', f'{together:,.0f}', f'{together:,.0f}']])
    print_table('Seeds batched into one model: the most they could gain',
                f"{variant}, train.py compiled, one run with {threads} thread(s), {steps} steps, "
                f"at the study's batch ({B} windows) and at 2 and 4 times it: training k seeds as "
                "one batched model does at least the work of one model on k times the batch, so "
                "the last column bounds its speed-up over k separate runs.",
                ['batch (windows)', 'tokens/s', 'over the study\'s batch'],
                [[f'{k * B}', f'{t:,.0f}', ratio(t, batched[0])] for k,
                 t in zip((1, 2, 4), batched)])

# -----------------------------------------------------------------------------------------------
# threads: a CPU run's speed at 1 and 2 threads, its idle threads spinning or sleeping, alone and on
# shared cores

TINY_CONFIG = os.path.join(ROOT, 'config', 'tiny_cpu.py')


def bench_threads(args, device):
    """train.py on the CPU as docs/training.md's small model by hand runs it (config/tiny_cpu.py),
    at 1 and 2 threads, with OpenMP's idle threads as libgomp leaves them (no OMP_WAIT_POLICY:
    they spin a while, then sleep), spinning (ACTIVE) or sleeping (PASSIVE, which every script
    sets at its top unless the environment holds a policy), alone and with every core shared (a
    busy loop per core, as another job on the machine)."""
    if device.type != 'cpu':
        log(f'  threads: a CPU section, skipped on {device.type}')
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, 'data')
        prepare_builtin(data)
        for busy in (False, True):
            others = [subprocess.Popen([sys.executable, '-c', 'while True: pass'])
                      for _ in range(os.cpu_count() if busy else 0)]
            machine = 'every core shared' if busy else 'alone'
            try:
                for threads in (1, 2):
                    speeds = []
                    for policy in ('', 'ACTIVE', 'PASSIVE'):
                        out = os.path.join(tmp, f'{busy}_{threads}_{policy}')
                        command = [sys.executable, 'train.py', TINY_CONFIG, f'--data_dir={data}',
                                   f'--out_dir={out}',
                                   f'--max_iters={args.threads_steps}',
                                   f'--eval_interval={args.threads_steps}',
                                   '--eval_batches=1', '--device=cpu']
                        (speed, _), = study_runs([command], threads, policy)
                        speeds.append(speed)
                        log(f'  threads: {machine}, {threads} thread(s), {policy or "unset"}: '
                            f'{speed:,.0f} tokens/s')
                    rows.append([machine, str(threads), *(f'{v:,.0f}' for v in speeds),
                                 ratio(speeds[2], speeds[0])])
            finally:
                for other in others:
                    other.kill()
                    other.wait()
    print_table('Threads on a shared CPU',
                "train.py config/tiny_cpu.py (docs/training.md's small model by hand: 830,592 "
                f"parameters, 16 x 256 tokens a step), {args.threads_steps} steps per run, "
                "tokens/s the median "
                f"step after the first 5; on {os.cpu_count()} cores. libgomp's default: no "
                "OMP_WAIT_POLICY (idle threads spin a while, then sleep); spinning: ACTIVE; "
                "sleeping: PASSIVE (this repository's default). Every core shared: one busy Python "
                "loop per core beside the run, as another job on the machine.",
                ['machine', 'threads', "tokens/s, libgomp's default", 'spinning', 'sleeping',
                 "sleeping / libgomp's default"], rows)


# -----------------------------------------------------------------------------
# probes: what the sink measures cost, at every evaluation and at the end of a run


def seconds(fn, repeats=3):
    """The median wall time of fn() over `repeats` calls, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_probes(args, device):
    """Per variant, on the sink study's model (config/sink_study.py, random weights: the cost does
    not depend on them): an evaluation as train.py runs it with attention_windows (the validation
    loss on eval_batches x micro_batch_size windows, the mean logit and probes.sink_record on the
    windows), and within it the measures of the sink-measures issue's items 1-5, each timed on its
    own on the layers' inputs of the windows: the first-token-or-null split and Gu et al.'s scores
    (first_token_weights, sink_scores, the negative rows), the value-weighted share (every
    VALUE_WEIGHTED_STRIDE-th query, as sink_record), alpha's summary, and the activation outliers (a
    forward with their hooks less one without); then the measures of the end of a run (analyze.py
    attention): Gu et al.'s setting, W8A8 and the knockout."""
    config = run_config(load_config([STUDY_CONFIG]))
    T, model_config = config.block_size, ModelConfig(**{key: getattr(config, key)
                                                        for key in FIELD_NAMES})
    n_val, n_windows = config.eval_batches * config.micro_batch_size, config.attention_windows
    generator = torch.Generator().manual_seed(0)
    tokens = lambda n, length: torch.randint(0, config.vocab_size, (n, length),
                                             generator=generator).to(device)
    val, windows, gu = tokens(n_val, T + 1), tokens(n_windows, T), tokens(GU_SAMPLES, GU_LENGTH)
    rows = []
    for variant in args.variants:
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(model_config, attention=variant)).to(device)
        layers = inspect_attention(model, windows, lambda attn, x, cos, sin, positions: (
            attn, x, cos, sin, attn.weights(x, cos, sin, positions).double()))

        def evaluation():
            with torch.no_grad():
                for i in range(0, n_val, config.micro_batch_size):
                    model(val[i:i + config.micro_batch_size, :-1],
                          val[i:i + config.micro_batch_size, 1:])
            mean_attention_logit(model, windows[:1])
            sink_record(model, windows)

        def items():
            for attn, x, cos, sin, w in layers:
                first_token_weights(w), sink_scores(w, *weight_rows(attn.config)), (
                    w.amin(-1) < 0).double().mean()
                value_weighted_first_token(attn, x, cos, sin, w, VALUE_WEIGHTED_STRIDE)
                if attn.config.variant.alpha:
                    alpha_summary(variant_statistics(attn, x)['alpha'])

        base = seconds(evaluation)
        added = max(0.0, seconds(items) + seconds(lambda: activation_outliers(model, windows))
                    - seconds(lambda: hooked_forward(model, windows, [])))
        end = [seconds(fn, repeats=1)
               for fn in (lambda: sink_rates(model, gu, batch_size=GU_SAMPLES),
                          lambda: w8a8_losses(model, val[:4, :-1], val[4:20, :-1], batch_size=16),
                          lambda: knockout_losses(model, val[4:20, :-1], batch_size=16))]
        rows.append([variant, f'{base:.2f}', f'{added:.3f}', f'{100 * added / base:.0f}%',
                     *[f'{t:.2f}' for t in end]])
        log(f'  probes: {variant:<14} evaluation {base:.2f} s, of which items 1-5 {added:.3f} s')
    print_table("What the sink measures cost",
                f"config/sink_study.py's model, {torch.get_num_threads()} thread(s), eager. "
                "Evaluation: what train.py runs at each evaluation with attention_windows, the "
                f"validation loss ({n_val} windows of {T} tokens), the mean logit and "
                f"probes.sink_record on its {n_windows} windows. Items 1-5: the part of it the "
                "sink measures of the measures issue add (first-token share, null mass and Gu's "
                f"scores; the value-weighted share on every {VALUE_WEIGHTED_STRIDE}th query; "
                "alpha's summary; the activation outliers), each timed alone. End of a run "
                f"(analyze.py attention): Gu et al.'s Sink_1 on {GU_SAMPLES} x {GU_LENGTH} tokens, "
                "W8A8 (4 calibration windows, 16 evaluated), the knockout (16 windows, each k). "
                "Seconds, median of 3 (end of run: one call).",
                ['variant', 'evaluation (s)', 'items 1-5 (s)', 'share', "Gu's setting (s)",
                 'W8A8 (s)', 'knockout (s)'], rows)

# -----------------------------------------------------------------------------
# eval: eval_zeroshot's batched scoring vs one request at a time


def synthetic_docs(n_docs, seed=0):
    """4-choice documents shaped like HellaSwag's: a context of 15-40 random words, endings of 3-12
    words."""
    rng = random.Random(seed)
    words = [''.join(rng.choices('abcdefghijklmnopqrstuvwxyz', k=rng.randint(2, 9)))
             for _ in range(500)]

    def text(lo, hi):
        return ' '.join(rng.choices(words, k=rng.randint(lo, hi)))

    return [choice_doc(text(15, 40), [text(3, 12) for _ in range(4)], rng.randrange(4))
            for _ in range(n_docs)]


def bench_eval(args, device):
    """Both scorers of eval_zeroshot on the same requests; their scores must agree (the last
    column). The tokens each computes show what the KV cache saves: each document's context once."""
    # eval_zeroshot's --dtype=auto
    dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32
    tiny = run_config(load_config([TINY_CONFIG]))
    docs, enc = synthetic_docs(args.eval_docs), load_tokenizer('bytes')
    documents = [d for d, doc in enumerate(docs) for _ in doc.requests]
    rows = []
    for variant in args.variants:
        torch.manual_seed(0)
        config = ModelConfig(**{key: getattr(tiny, key)
                                for key in FIELD_NAMES} | dict(attention=variant))
        model = GPT(config).to(device=device, dtype=dtype).eval()
        requests = encode_docs('synthetic', docs, enc, config.block_size)
        # warm-up, both scorers
        score_requests(model, requests[:args.eval_batch_size], args.eval_batch_size)
        score_one_by_one(model, requests[:args.eval_batch_size])
        tokens = []  # each forward's tokens, padding included
        hook = model.model.embed_tokens.register_forward_hook(lambda m, inputs,
                                                              out: tokens.append(inputs[0].numel()))
        t0 = time.perf_counter()
        batched = score_requests(model, requests, args.eval_batch_size,
                                 Progress(f'  eval: {variant} batched', len(docs)), documents)
        t_batched, batched_tokens = time.perf_counter() - t0, sum(tokens)
        t0 = time.perf_counter()
        single = score_one_by_one(model, requests,
                                  Progress(f'  eval: {variant} one by one', len(requests)))
        t_single, single_tokens = time.perf_counter() - t0, sum(tokens) - batched_tokens
        hook.remove()
        rows.append([variant, str(len(docs)), str(len(requests)), f'{batched_tokens:,}',
                     f'{single_tokens:,}',
                     f'{len(docs) / t_batched:.1f}', f'{len(docs) / t_single:.1f}',
                     ratio(t_single, t_batched),
                     f'{max(abs(a - b) for a, b in zip(batched, single)):.1e}'])
        log(f'  eval: {variant:<14} batched {t_batched:.2f} s, one by one {t_single:.2f} s')
    print_table('Zero-shot evaluation: batched vs one request at a time',
                f'config/tiny_cpu.py shape, random weights, {str(dtype).removeprefix("torch.")}, '
                f'eager; {len(docs)} synthetic 4-choice docs (byte tokens; contexts of 15-40 '
                'words, endings of 3-12). Batched: zeroshot.score_requests, batch size '
                f'{args.eval_batch_size}, each document\'s context once where the variant allows '
                'it (ModelConfig.outputs_depend_on_length); one by one: zeroshot.score_one_by_one '
                '(the harness at batch size 1).',
                ['variant', 'docs', 'requests', 'tokens (batched)', 'tokens (one by one)',
                 'batched docs/s', 'one-by-one docs/s', 'speedup', 'max abs loglik diff'], rows)


def timed_process(command, threads):
    """Wall seconds of a command run to its end, offline, with `threads` threads (OMP_NUM_THREADS,
    which torch reads); a RunError with its output's tail where it fails."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_DATASETS_OFFLINE='1',
               HF_HUB_OFFLINE='1', TOKENIZERS_PARALLELISM='false')
    t0 = time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode:
        raise RunError(f"{shlex.join(command[:3])} ... failed (exit status {run.returncode}): "
                       f"{(run.stdout + run.stderr)[-2000:]}")
    return time.perf_counter() - t0


def harness_samples(out_dir, name):
    """{doc_id: [each choice's log-likelihood]} and {metric: value} of task `name` from lm_eval's
    --output_path."""
    (samples,), (results,) = (glob.glob(os.path.join(out_dir, '*', f'{kind}_*.json*'))
                              for kind in (f'samples_{name}', 'results'))
    with open(samples, encoding='utf-8') as f:
        logliks = {r['doc_id']: [float(choice[0]) for choice in r['filtered_resps']]
                   for r in map(json.loads, f)}
    with open(results, encoding='utf-8') as f:
        metrics = json.load(f)['results'][name]
    return logliks, {m: metrics[f'{m},none'] for m in ('acc', 'acc_norm') if f'{m},none' in metrics}


def harness_whole_processes(args, device, dtype, tmp):
    """eval_zeroshot.py and `lm_eval --model hf` on the six tasks (tools/harness_tasks.py,
    --harness_docs each), timed as whole processes: (eval_zeroshot's seconds, lm_eval's, the largest
    log-likelihood difference, the largest accuracy difference)."""
    env_python = os.path.join(args.harness_env, 'bin', 'python')
    tasks_dir = subprocess.run([env_python, '-c',
                                'import lm_eval, os; print(os.path.dirname(lm_eval.__file__))'],
                               capture_output=True, text=True).stdout.strip()
    if not tasks_dir:
        raise RunError(f"--harness_env={args.harness_env}: lm_eval does not import with its Python "
                       f"({env_python}); make it as docs/benchmarks.md says")
    paths = write_tasks(os.path.join(tmp, 'data'), args.harness_docs)
    names = write_harness_yamls(os.path.join(tmp, 'yaml'), os.path.join(tasks_dir, 'tasks'), paths)
    threads, batch = torch.get_num_threads(), str(args.eval_batch_size)
    t_theirs = timed_process([os.path.join(args.harness_env, 'bin', 'lm_eval'), '--model', 'hf',
                              '--model_args',
                              f'pretrained={args.harness_model},dtype={dtype}', '--tasks',
                              ','.join(names),
                              '--include_path', os.path.join(tmp, 'yaml'), '--batch_size', batch,
                              '--device',
                              str(device), '--log_samples', '--output_path',
                              os.path.join(tmp, 'theirs')], threads)
    t_ours = timed_process([sys.executable, 'eval_zeroshot.py', f'--hf_model={args.harness_model}',
                            f'--data_dir={tmp}/data', f'--tasks={",".join(paths)}',
                            f'--batch_size={batch}',
                            f'--device={device}', f'--dtype={dtype}', '--log_samples=True',
                            f'--out={tmp}/ours.json'], threads)
    with open(os.path.join(tmp, 'ours.json'), encoding='utf-8') as f:
        ours = json.load(f)
    loglik_diff = acc_diff = 0.0
    for task, name in zip(paths, names):
        logliks, metrics = harness_samples(os.path.join(tmp, 'theirs'), name)
        for i, doc in enumerate(ours[task]['docs']):
            loglik_diff = max([loglik_diff]
                              + [abs(a - b) for a,
                                 b in zip(doc['logliks'], logliks[i], strict=True)])
        acc_diff = max([acc_diff] + [abs(value - ours[task][m]) for m, value in metrics.items()])
    return t_ours, t_theirs, loglik_diff, acc_diff


def harness_in_process(args, device, dtype, tmp):
    """--harness_synthetic_docs HellaSwag-shaped documents (tools/harness_tasks.py), scored in
    process: zeroshot.score_requests with each context once, and the harness's HFLM.loglikelihood in
    lm_eval's environment (tools/lm_eval_scores.py). Returns (docs, requests, our seconds, theirs,
    the largest log-likelihood difference)."""
    docs = build_docs('hellaswag', task_rows('hellaswag', args.harness_synthetic_docs, seed=1),
                      'synthetic')
    model, enc = load_model_and_tokenizer(args.harness_model, None, device, getattr(torch, dtype))
    requests = encode_docs('synthetic', docs, enc, model.config.block_size)
    documents = [d for d, doc in enumerate(docs) for _ in doc.requests]
    score_requests(model, requests[:args.eval_batch_size], args.eval_batch_size)  # warm-up
    t0 = time.perf_counter()
    ours = score_requests(model, requests, args.eval_batch_size,
                          Progress('  harness: eval_zeroshot',
                                   len(docs)),
                          documents)
    t_ours = time.perf_counter() - t0
    del model
    pairs_path, out_path = os.path.join(tmp, 'pairs.json'), os.path.join(tmp, 'theirs.json')
    with open(pairs_path, 'w', encoding='utf-8') as f:
        json.dump([pair for doc in docs for pair in doc.requests], f)
    log('  harness: lm-eval in process ...')
    timed_process([os.path.join(args.harness_env, 'bin', 'python'),
                   os.path.join(ROOT, 'tools', 'lm_eval_scores.py'),
                   args.harness_model, pairs_path, str(args.eval_batch_size), dtype, str(device),
                   out_path],
                  torch.get_num_threads())
    with open(out_path, encoding='utf-8') as f:
        theirs = json.load(f)
    diff = max(abs(a - b) for a, b in zip(ours, theirs['logliks'], strict=True))
    return len(docs), len(requests), t_ours, theirs['seconds'], diff


def bench_harness(args, device):
    """eval_zeroshot against lm-evaluation-harness 0.4.9 on a real model (--harness_model, a Hugging
    Face directory such as scripts/gguf_to_hf.py --gguf=smollm2 writes), lm_eval run from its own
    environment (--harness_env): as whole processes on the six tasks, and in process on synthetic
    documents; each side tokenizes the text itself, and their log-likelihoods must agree (the last
    columns)."""
    if args.harness_model is None or args.harness_env is None:
        return log('  harness: skipped: give --harness_model=DIR (a Hugging Face model directory) '
                   'and --harness_env=DIR (an environment with lm_eval 0.4.9: docs/benchmarks.md)')
    dtype = 'bfloat16' if device.type == 'cuda' else 'float32'
    shown_device = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'
    with tempfile.TemporaryDirectory() as tmp:
        t_ours, t_theirs, loglik_diff, acc_diff = harness_whole_processes(args, device, dtype, tmp)
        print_table('Zero-shot evaluation against lm-evaluation-harness: whole processes',
                    f'{args.harness_model}, {dtype}, {shown_device}, {torch.get_num_threads()} '
                    f'threads each; the six tasks, {args.harness_docs} documents each '
                    f'(tools/harness_tasks.py), batch size {args.eval_batch_size}: `python '
                    'eval_zeroshot.py --hf_model` against `lm_eval --model hf` (0.4.9, '
                    '--include_path tasks reading the same files), start to exit.',
                    ['documents', 'eval_zeroshot.py (s)', 'lm_eval (s)', 'lm_eval / eval_zeroshot',
                     'max abs loglik diff', 'max acc diff'],
                    [[str(6 * args.harness_docs), f'{t_ours:.1f}', f'{t_theirs:.1f}',
                      ratio(t_theirs, t_ours), f'{loglik_diff:.1e}', f'{acc_diff:.3f}']])
        n, n_requests, t_ours, t_theirs, diff = harness_in_process(args, device, dtype, tmp)
        print_table('Zero-shot evaluation against lm-evaluation-harness: in process',
                    f'{args.harness_model}, {dtype}, {shown_device}, {torch.get_num_threads()} '
                    f'threads; {n} HellaSwag-shaped documents ({n_requests} requests; '
                    f'tools/harness_tasks.py), batch size {args.eval_batch_size}: '
                    'zeroshot.score_requests with each context once against HFLM.loglikelihood in '
                    'its own process (tools/lm_eval_scores.py); the scoring calls alone.',
                    ['documents', 'eval_zeroshot docs/s', 'lm-eval docs/s',
                     'lm-eval / eval_zeroshot', 'max abs loglik diff'],
                    [[str(n), f'{n / t_ours:.1f}', f'{n / t_theirs:.1f}', ratio(t_theirs, t_ours),
                      f'{diff:.1e}']])


SECTIONS = dict(attention=bench_attention, kd=bench_kd, train=bench_train, eval=bench_eval,
                harness=bench_harness,
                study=bench_study, probes=bench_probes, threads=bench_threads,
                tokenizer=bench_tokenizer)
MEMORY_SECTIONS = ('attention', 'kd')  # they measure peak memory
# what --check hands over to tools/gpu_check.py, under the same names there: its own keys (None: not
# given, tools/gpu_check.py's default) and the two that the benchmark sections share with it, whose
# defaults are the same there
CHECK_KEYS = ('check_json', 'check_parts', 'check_batch_size', 'steps', 'kd_tokens')


KEYS = dict(
    check=Key(False, 'instead of the benchmarks, the GPU acceptance run (tools/gpu_check.py, with '
                     '--check_*)'),
    check_json=Key(None, "--check: tools/gpu_check.py's --check_json", types=(str,)),
    check_parts=Key(None, "--check: tools/gpu_check.py's --check_parts", types=(list,)),
    check_batch_size=Key(None, "--check: tools/gpu_check.py's "
                               "--check_batch_size", types=(int,), min=1),
    sections=Key(list(SECTIONS), 'comma-separated', choices=tuple(SECTIONS)),
    device=DEVICE,
    compile=Key(None, 'torch.compile the timed training steps (default: on for CUDA, off for '
                      'CPU)', types=(bool,)),
    # the model of the attention and train sections
    n_layer=Key(4, min=1), n_embd=Key(512, min=1), n_head=Key(8, min=1), n_kv_head=Key(2, min=1),
    vocab_size=Key(8192, min=1),
    # attention
    seq_lens=Key([1024, 2048], 'comma-separated', min=1),
    steps=Key(7, 'timed rounds (one step of every variant each; median)', min=1),
    batch_size=Key(1, min=1),
    # kd
    kd_tokens=Key(8192, min=1), kd_vocab=Key(128256, min=1), kd_hidden=Key(2048, min=1),
    # train and eval
    variants=Key([BASELINE, PROPOSED], 'comma-separated', choices=ATTENTIONS),
    train_steps=Key(10, min=1),
    train_batch_size=Key(None, 'default: 8 on CPU, 64 on CUDA', types=(int,), min=1),
    train_seq_len=Key(256, min=1), eval_docs=Key(200, min=1), eval_batch_size=Key(32, min=1),
    # study
    study_steps=Key(100, "study: steps per train.py run (the study's runs have "
                         "config/sink_study.py's max_iters)",
                    min=6),
    study_threads=Key(1, "study: threads per process (the study's: cores / jobs)", min=1),
    threads_steps=Key(30, "threads: steps per train.py run", min=6),
    # tokenizer (needs tokenizers)
    tokenizer_styles=Key(['gpt2', 'llama3', 'smollm'], "tokenizer: the tokenizers' "
                         'pre-tokenizers, comma-separated', choices=('gpt2', 'llama3', 'smollm')),
    tokenizer_vocab=Key(32000, 'tokenizer: their vocabulary size', min=300),
    tokenizer_every=Key(4, 'tokenizer: time every k-th file of the standard library', min=1),
    tokenizer_repeats=Key(2, 'tokenizer: runs of each library (the best is shown)', min=1),
    # harness (needs lm-evaluation-harness 0.4.9, which needs transformers 4)
    harness_model=Key(None, 'harness: a Hugging Face model directory, e.g. what '
                            'scripts/gguf_to_hf.py writes',
                      types=(str,)),
    harness_env=Key(None, 'harness: a Python environment where lm_eval 0.4.9 imports '
                          '(docs/benchmarks.md)',
                    types=(str,)),
    harness_docs=Key(25, 'harness: documents of each of the six tasks, for the whole '
                         'processes', min=1),
    harness_synthetic_docs=Key(500, 'harness: synthetic 4-choice documents, in process', min=1),
)


def parse_args(argv):
    args = types.SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS, __doc__,
                                         prog='python -m tools.bench'))
    args.device = str(resolve_device(args.device))
    cuda = args.device.startswith('cuda')
    args.compile = cuda if args.compile is None else args.compile
    args.train_batch_size = args.train_batch_size or (64 if cuda else 8)
    return args


def hand_over_to_gpu_check(args):
    """--check: this process becomes `python -m tools.gpu_check` with the CHECK_KEYS given, so that
    the output, the exit status and the signals (a scheduler's SIGTERM, Ctrl-C) are the check's own.
    Run, not imported: tools/gpu_check.py is a script of its own, which no module or other script
    imports (docs/implementation.md)."""
    argv = [f'--{name}={shown(getattr(args, name))}' for name in CHECK_KEYS
            if getattr(args, name) is not None]
    sys.stdout.flush()
    sys.stderr.flush()
    # (from the root, as this runs)
    os.execv(sys.executable, [sys.executable, '-m', 'tools.gpu_check', *argv])


def main(argv=None):
    args = parse_args(argv)
    if args.check:
        hand_over_to_gpu_check(args)
    device = torch.device(args.device)
    name = (torch.cuda.get_device_name(device) if device.type == 'cuda'
            else f'CPU, {torch.get_num_threads()} threads')
    print(f'# tools/bench.py on {name}; torch {torch.__version__}; {dtype_name(device)}')
    # the memory sections first, in a fresh process: their CPU measurement needs a small mmap
    # threshold
    for section in sorted(args.sections, key=lambda s: s not in MEMORY_SECTIONS):
        if device.type == 'cpu':
            set_mmap_threshold(128 * 1024 if section in MEMORY_SECTIONS else 32 * 2 ** 20)
        log(f'{section} ...')
        t0 = time.perf_counter()
        SECTIONS[section](args, device)
        log(f'{section}: {time.perf_counter() - t0:.0f} s')


if __name__ == '__main__':
    sys.exit(run_script(main))
