"""
Benchmarks, measured side by side in one run on whatever device is found: CPU runs float32 eager; CUDA runs
bf16 autocast, with torch.compile (each decoder layer, as train.py) where a training step is timed. Each section prints a Markdown table under
its own heading; progress goes to stderr. Timings are reports, never pass/fail.

    python bench.py                                        # every section at the sizes below
    python bench.py --sections=attention,train --steps=7   # some sections
    python bench.py --sections=kd --kd_tokens=1024 --kd_hidden=512    # KD at V = 128,256 in ~2.5 GiB, not ~20

Sections:
  attention  per variant at T = 1024 and 2048: forward+backward time and peak memory of one training step,
             as ratios to softmax; "affine (explicit T x T)" is Eq. 6 as a user would first write it from the
             paper, the peer our O(T) affine is measured against
  kd         distill.fused_kd_loss vs the naive full-logits KL at V = 128,256, 8,192 tokens, hidden 2048; the
             naive path (~20 GiB) is skipped, with its estimate printed, where it would not fit in memory
  train      tokens/s and MFU of real AdamW steps of a small model: common.flops_per_token x tokens/s over the
             device's measured matmul peak at the model's matmul shapes (common.measured_matmul_flops)
  eval       docs/s of eval_zeroshot's batched scoring vs one request per forward, synthetic 4-choice docs
  harness    docs/s of eval_zeroshot vs lm-evaluation-harness 0.4.9 on a real model (--harness_model; lm_eval installed)
  study      the sink study's runs: tokens/s of train.py as sink_study.py starts it (eager, and compiled as the study
             runs it; its seconds outside the steps) against a plain PyTorch loop on the same shape; 2 one-thread
             processes side by side against one with 2 threads

The memory plan: fake_peak_memory measures the peak of a training micro-step of a train.py config on fake tensors
(torch's MemTracker: real shapes, no memory, no GPU), what train.py --dry_run's plan (memory_plan.py) is held to
(tests/test_gpu_path.py; at full depth, scripts/memory_tables.py --measure=True).

Peak memory: CUDA's allocator peak (max_memory_allocated) on GPU; on CPU the rise of the process's peak
resident set size during the measured step (VmHWM, reset through /proc/self/clear_refs), with glibc's mmap
threshold pinned so that every freed tensor really leaves the process.
"""
import contextlib
import ctypes
import gc
import importlib.util
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings
from unittest import mock

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker

import distill
import prepare_data
from checkpoint import read_checkpoint
from distill import fused_kd_loss, kd_loss, load_teacher
from common import (KNOWN_PEAK_BF16, Progress, apply_fsdp, compile_layers, default_peak_flops, flops_per_token,
                    gemm_shapes, measured_matmul_flops, resolve_device, wrap_ddp)
from configurator import DEVICE, Key, parse
from files import RunError, read_log, run_script, write_json
from eval_zeroshot import (choice_doc, encode_docs, load_model_and_tokenizer, plan_forwards, score_one_by_one,
                           score_requests)
from model import ATTENTIONS, BASELINE, FIELD_NAMES, GPT, MODEL_SHAPES, PROPOSED, ModelConfig
from data import Windows
from memory_plan import KNOWN_TEACHERS, memory_estimate, plan_dtype
from sink_study import EVALUATIONS
from tokenizer import load_tokenizer
from train import compute_loss, configure_optimizers, load_config

EXPLICIT = f'{PROPOSED} (explicit T x T)'  # the paper's variant as its explicit weights: what its O(T) form saves
TINY_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config', 'tiny_cpu.py')

# -----------------------------------------------------------------------------
# Measuring


def set_mmap_threshold(n_bytes):
    """glibc's mmap threshold, fixed (which also stops its adjustment). The memory sections set it low: glibc
    would otherwise raise it after the first big free and keep later tensors on the heap, where freeing them
    need not lower the resident size, so on CPU the resident set follows the live tensors and its peak measures
    theirs. The timing sections set it to the dynamic threshold's ceiling (32 MiB), close to what a normal run
    settles at, so that their large allocations are not each a fresh mmap."""
    if sys.platform == 'linux':
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, n_bytes)  # -3: M_MMAP_THRESHOLD
        libc.malloc_trim(0)  # what earlier sections freed onto the heap goes back to the kernel


class PeakMemory:
    """Peak bytes allocated during the `with` block (beyond what was live when it started)."""

    def __init__(self, device):
        self.device = device

    def _rss(self, field):
        return int(re.search(rf'{field}:\s+(\d+)', open('/proc/self/status').read()).group(1)) * 1024

    def __enter__(self):
        if self.device.type == 'cuda':
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')  # reset VmHWM to the current resident size
            self.start = self._rss('VmRSS')
        return self

    def __exit__(self, *exc):
        if self.device.type == 'cuda':
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self.peak = self._rss('VmHWM') - self.start


def available_memory(device):
    """Bytes that can still be allocated: free GPU memory, or the kernel's MemAvailable estimate."""
    if device.type == 'cuda':
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    return int(re.search(r'MemAvailable:\s+(\d+)', open('/proc/meminfo').read()).group(1)) * 1024


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda')


def dtype_name(device):
    return 'bf16 autocast' if device.type == 'cuda' else 'float32'


def log(message):
    print(message, file=sys.stderr, flush=True)


def ratio(x, base):
    return f'{x / base:.2f}' if base else '-'


def mib(n_bytes):
    return f'{n_bytes / 2**20:.1f}'


def print_table(title, notes, header, rows):
    """One section: a heading, what was measured and how, and a Markdown table of already formatted cells."""
    print(f'\n## {title}\n\n{notes}\n')
    print('| ' + ' | '.join(header) + ' |')
    print('|' + '---|' * len(header))
    for row in rows:
        print('| ' + ' | '.join(row) + ' |')
    sys.stdout.flush()


def model_config(args, attention, block_size):
    """The model of the attention and train sections (SwiGLU width 8/3 n_embd, rounded down to 64)."""
    return ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_kv_head, n_embd=args.n_embd,
                       intermediate_size=args.n_embd * 8 // 3 // 64 * 64, vocab_size=args.vocab_size,
                       block_size=block_size, attention=attention)


def model_shape(args):
    return (f'n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head} n_kv_head={args.n_kv_head} '
            f'vocab={args.vocab_size}')

# -----------------------------------------------------------------------------
# attention: one training step per variant, vs softmax and vs the explicit T x T affine


def bench_attention(args, device):
    """Per sequence length: build every variant, then time them in interleaved rounds (one step of each
    per round, median over rounds), so drift in machine load hits all variants alike."""
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
            log(f'  attention: {variant:<24} T={T:<5} {measured[-1][1] * 1e3:9.1f} ms {mib(mem.peak):>9} MiB')
        del steps
        _, base_time, base_mem = measured[0]  # softmax
        rows += [[v, str(T), f'{t * 1e3:.1f}', ratio(t, base_time), mib(m), ratio(m, base_mem)] for v, t, m in measured]
    print_table('Attention variants: one training step (forward + backward)',
                f'Model {model_shape(args)}, batch {args.batch_size}; {dtype_name(device)}, compile={args.compile}; '
                f'median of {args.steps} interleaved rounds; peak memory of one step. Sink runs the LSE-corrected '
                f'flash kernel on CPU and CUDA. "{EXPLICIT}": Eq. 6 with the T x T matrix built explicitly.',
                ['variant', 'T', 'fwd+bwd (ms)', 'time / softmax', 'peak mem (MiB)', 'mem / softmax'], rows)

# -----------------------------------------------------------------------------
# kd: fused_kd_loss vs the naive full-logits KL


def kd_problem(N, V, C_s, C_t, device, hidden_dtype):
    """Random hidden states and lm_heads of a student (C_s wide, hidden states in hidden_dtype, fp32 head) and a
    teacher (C_t wide; bf16 on CUDA, as train.py loads it), and the two KD paths on them, each a function that runs
    one forward + backward (under bf16 autocast on CUDA) and returns the loss: 'naive', distill.kd_loss (both
    models' full logits, then the KL; autocast computes the log-softmaxes in fp32), and 'fused_kd_loss'.
    Returns (h_s, w_s, paths); gradients land in h_s.grad and w_s.grad."""
    low = torch.bfloat16 if device.type == 'cuda' else torch.float32
    torch.manual_seed(0)
    h_s = torch.randn(N, C_s, device=device, dtype=hidden_dtype, requires_grad=True)
    w_s = (torch.randn(V, C_s, device=device) * C_s ** -0.5).requires_grad_()
    h_t = torch.randn(N, C_t, device=device, dtype=low)
    w_t = (torch.randn(V, C_t, device=device) * C_t ** -0.5).to(low)
    losses = dict(naive=lambda: kd_loss(h_s, w_s, h_t, w_t)[0],
                  fused_kd_loss=lambda: fused_kd_loss(h_s, w_s, h_t, w_t)[0])

    def step(loss_fn):
        h_s.grad = w_s.grad = None  # each step computes its gradients afresh
        with autocast(device):
            loss = loss_fn()
        loss.backward()
        return loss.detach()

    return h_s, w_s, {name: (lambda fn=fn: step(fn)) for name, fn in losses.items()}


def bench_kd(args, device):
    """One forward + backward of pure KD (T = 1) per path, on random hidden states and lm_heads; in training
    dtypes on CUDA (bf16 hidden states and teacher head, float32 student head, autocast)."""
    N, V, C = args.kd_tokens, args.kd_vocab, args.kd_hidden
    h_s, w_s, paths = kd_problem(N, V, C, C, device, torch.bfloat16 if device.type == 'cuda' else torch.float32)
    # at its peak the naive path holds five N x V float32 tensors (the saved log-softmaxes and the KL's terms,
    # forward and backward alike): 19.57 GiB at the default sizes, where 19.58 GiB was measured on CPU
    estimate, available = 5 * N * V * 4, available_memory(device)
    results = {}
    for name, step in paths.items():
        if name == 'naive' and estimate > available:
            log(f'  kd: naive skipped: it needs ~{estimate / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available')
            continue
        if device.type == 'cuda':
            step()  # warm-up: CUDA context, cuBLAS workspaces
        h_s.grad = w_s.grad = None  # freed before the measurement: the step's own gradients count in its peak
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
        rows.insert(0, ['naive', 'skipped: would not fit', '-', f'~{mib(estimate)} (estimate)', '-', '-'])
    print_table('KD loss: fused_kd_loss vs naive full logits',
                f'{N:,} tokens, V = {V:,}, hidden {C}; one forward + backward of KD (T = 1, pure KD); '
                f'{"bf16 hidden states and teacher head, autocast" if device.type == "cuda" else "float32"}, eager. '
                f'Naive path estimated at {estimate / 2**30:.2f} GiB, {available / 2**30:.1f} GiB available.',
                ['path', 'time (s)', 'time / naive', 'peak mem (MiB)', 'mem / naive', 'loss'], rows)

# -----------------------------------------------------------------------------
# train: tokens/s and MFU of real optimizer steps


def bench_train(args, device):
    """Forward, backward, AdamW step and alpha_ma update, on one fixed random batch (no data loading), after
    two warm-up steps (compilation, AdamW's state). MFU as train.py logs it (common.flops_per_token), over the
    measured matmul peak at the shapes of every variant's matmuls."""
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
            f'{default_peak_flops(device, dtype, sorted(shapes)) / 1e12:.0f} TFLOP/s.' if device.type == 'cuda' else '.')
    rows = [[variant, f'{params:,}', f'{dt * 1e3:.1f}', f'{B * T / dt:,.0f}', f'{flops / 1e12:.3f}',
             f'{100 * flops / peak:.1f}%'] for variant, params, dt, flops in rows]
    print_table('Training throughput',
                f'Model {model_shape(args)}, batch {B} x {T} tokens, {args.train_steps} timed AdamW steps; '
                f'{dtype_name(device)}, compile={args.compile}. MFU = common.flops_per_token x tokens/s over the '
                f'measured matmul peak at the model\'s matmul shapes, {peak / 1e12:.2f} TFLOP/s '
                f'(common.measured_matmul_flops{how})' + note,
                ['variant', 'params', 'step (ms)', 'tokens/s', 'model TFLOP/s', 'MFU'], rows)

# -----------------------------------------------------------------------------
# study: the sink study's runs (train.py as sink_study.py starts them) vs a plain PyTorch loop on the same shape

STUDY_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config', 'sink_study.py')


def plain_loop(config, steps, device, threads):
    """tokens/s of the loop the study is held to: the study's model and batch in a plain PyTorch loop, as one first
    writes it: AdamW over every parameter at one learning rate, batches sliced at random from a random token stream,
    eager, nothing else (no schedule, clipping, logging, evaluation or checkpoint), on `threads` threads. Median
    step after 5 warm-up."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{key: config[key] for key in FIELD_NAMES})).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config['learning_rate'], weight_decay=config['weight_decay'])
    B, T = config['global_batch_size'], config['block_size']
    stream = torch.randint(0, config['vocab_size'], (1_000_000,))
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
    """train.py as sink_study.py starts a run, for `steps` steps with the study's evaluations per run."""
    return [sys.executable, 'train.py', STUDY_CONFIG, f'--data_dir={data_dir}', f'--out_dir={out_dir}',
            f'--attention={variant}', f'--max_iters={steps}', f'--eval_interval={max(1, steps // EVALUATIONS)}',
            f'--compile={compile}', f'--device={device}']


def study_runs(commands, threads):
    """Run train.py commands side by side, each with `threads` threads; per run (median tokens/s of its steps after
    the first 5, as its metrics.jsonl records them; seconds outside the steps: start, compile, evaluations and
    checkpoints, from its wall time)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    here = os.path.dirname(os.path.abspath(__file__))
    out_dirs = [next(a.partition('=')[2] for a in c if a.startswith('--out_dir=')) for c in commands]
    outputs = [open(f'{d}.log', 'w') for d in out_dirs]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=here, env=env, stdout=output, stderr=subprocess.STDOUT)
             for c, output in zip(commands, outputs)]
    walls = {}
    while len(walls) < len(procs):
        walls |= {i: time.perf_counter() - t0 for i, p in enumerate(procs) if i not in walls and p.poll() is not None}
        time.sleep(0.05)
    results = []
    for i, (command, proc, out_dir, output) in enumerate(zip(commands, procs, out_dirs, outputs)):
        output.close()
        if proc.returncode != 0:
            with open(output.name) as f:
                raise RunError(f"{shlex.join(command)} failed:\n{f.read()[-2000:]}")
        steps = [r for r in read_log(os.path.join(out_dir, 'metrics.jsonl')) if 'tokens_per_sec' in r]
        results.append((statistics.median(r['tokens_per_sec'] for r in steps[5:] or steps),
                        walls[i] - sum(r['dt'] for r in steps)))
    return results


def bench_study(args, device):
    """Per variant: the plain loop, train.py eager, and train.py as the study runs it (config/sink_study.py: layers
    compiled); then the processes (the study's 2 one-thread runs side by side against one run on 2 threads) and what
    the attention statistics of its evaluations cost."""
    config = load_config([STUDY_CONFIG])
    B, T, threads = config['global_batch_size'], config['block_size'], args.study_threads
    steps, full = args.study_steps, config['max_iters']
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, 'data')  # the built-in corpus: throughput does not depend on which text it is
        with contextlib.redirect_stdout(sys.stderr):
            prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={data}', '--val_every=10'])
        run = lambda variant, compile, i=0: study_command(variant, steps, compile, data,
                                                         os.path.join(tmp, f'{variant}_{compile}_{i}'), device)
        for variant in args.variants:
            plain = plain_loop(config | dict(attention=variant), steps, device, threads)
            (eager, _), = study_runs([run(variant, False)], threads)
            (compiled, outside), = study_runs([run(variant, True)], threads)
            rows.append([variant, f'{plain:,.0f}', f'{eager:,.0f}', f'{compiled:,.0f}', ratio(compiled, plain),
                         f'{outside:.0f}', f'{(outside + full * B * T / compiled) / 60:.1f}'])
            log(f'  study: {variant:<14} plain {plain:,.0f}, train.py eager {eager:,.0f}, compiled {compiled:,.0f} '
                f'tokens/s; {outside:.0f} s outside the steps')
        variant = args.variants[0]
        side = study_runs([run(variant, True, i) for i in range(2)], threads)
        (together, _), = study_runs([run(variant, True, 9)], 2 * threads)
        # the analysis passes: a run without the attention statistics at its evaluations, beside one with them
        (_, without), (_, with_stats) = study_runs([run(variant, True, 8) + ['--attention_windows=0'],
                                                    run(variant, True, 7)], threads)
    print_table("The sink study's runs: train.py against a plain PyTorch loop",
                f"config/sink_study.py's model and batch ({B} x {T} tokens), {threads} thread(s) per process, "
                f"{steps} steps per run (tokens/s: the median step after the first 5). Plain loop: bench.plain_loop, "
                f"eager. train.py: the study's command (its data loading, schedule, clipping, logging, 8 "
                f"evaluations with the attention statistics, checkpoints), eager and as the study runs it (layers "
                f"compiled); 'outside the steps': its seconds of start, compile, evaluations and checkpoints. A study "
                f"run of {full:,} steps: those seconds plus its steps at the compiled rate.",
                ['variant', 'plain loop tokens/s', 'train.py eager', 'train.py compiled', 'compiled / plain',
                 'outside the steps (s)', f'a {full:,}-step run (min)'], rows)
    print_table('Processes',
                f"{variant}, train.py compiled, {steps} steps: the study's way on a 2-core machine (2 runs side by "
                f"side, {threads} thread(s) each) against one run with {2 * threads}. The attention statistics of the "
                f"{EVALUATIONS} evaluations (train.sink_record, the study's analysis pass) cost "
                f"{with_stats - without:.1f} s of a "
                f"run's {with_stats:.0f} s outside its steps (two runs side by side, one with --attention_windows=0)).",
                ['processes x threads', 'tokens/s per run', 'tokens/s in all'],
                [[f'2 x {threads}', ' / '.join(f'{t:,.0f}' for t, _ in side), f'{sum(t for t, _ in side):,.0f}'],
                 [f'1 x {2 * threads}', f'{together:,.0f}', f'{together:,.0f}']])

# -----------------------------------------------------------------------------
# eval: eval_zeroshot's batched scoring vs one request at a time


def synthetic_docs(n_docs, seed=0):
    """4-choice documents shaped like HellaSwag's: a context of 15-40 random words, endings of 3-12 words."""
    rng = random.Random(seed)
    words = [''.join(rng.choices('abcdefghijklmnopqrstuvwxyz', k=rng.randint(2, 9))) for _ in range(500)]

    def text(lo, hi):
        return ' '.join(rng.choices(words, k=rng.randint(lo, hi)))

    return [choice_doc(text(15, 40), [text(3, 12) for _ in range(4)], rng.randrange(4)) for _ in range(n_docs)]


def bench_eval(args, device):
    """Both scorers of eval_zeroshot on the same requests; their scores must agree (the last column)."""
    dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32  # eval_zeroshot's --dtype=auto
    tiny = load_config([TINY_CONFIG])
    docs, enc = synthetic_docs(args.eval_docs), load_tokenizer('bytes')
    rows = []
    for variant in args.variants:
        torch.manual_seed(0)
        config = ModelConfig(**{key: tiny[key] for key in FIELD_NAMES} | dict(attention=variant))
        model = GPT(config).to(device=device, dtype=dtype).eval()
        requests = encode_docs('synthetic', docs, enc, config.block_size)
        forwards = len(set(plan_forwards(requests, not config.outputs_depend_on_length)))
        score_requests(model, requests[:args.eval_batch_size], args.eval_batch_size)  # warm-up, both scorers
        score_one_by_one(model, requests[:args.eval_batch_size])
        t0 = time.perf_counter()
        batched = score_requests(model, requests, args.eval_batch_size,
                                 Progress(f'  eval: {variant} batched', forwards))
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        single = score_one_by_one(model, requests, Progress(f'  eval: {variant} one by one', len(requests)))
        t_single = time.perf_counter() - t0
        rows.append([variant, str(len(docs)), str(len(requests)), str(forwards), f'{len(docs) / t_batched:.1f}',
                     f'{len(docs) / t_single:.1f}', ratio(t_single, t_batched),
                     f'{max(abs(a - b) for a, b in zip(batched, single)):.1e}'])
        log(f'  eval: {variant:<14} batched {t_batched:.2f} s, one by one {t_single:.2f} s')
    print_table('Zero-shot evaluation: batched vs one request at a time',
                f'config/tiny_cpu.py shape, random weights, {str(dtype).removeprefix("torch.")}, eager; {len(docs)} '
                f'synthetic 4-choice docs (byte tokens; contexts of 15-40 words, endings of 3-12). Batched: '
                f'eval_zeroshot.score_requests, batch size {args.eval_batch_size}; one by one: '
                f'eval_zeroshot.score_one_by_one (the harness at batch size 1).',
                ['variant', 'docs', 'requests', 'forwards (batched)', 'batched docs/s', 'one-by-one docs/s',
                 'speedup', 'max abs loglik diff'], rows)


def harness_loglikelihoods(model_dir, docs, batch_size, device, dtype):
    """lm-evaluation-harness 0.4.9's log-likelihoods of every (context, continuation) of docs, in order, from its
    HFLM (lm_eval/models/huggingface.py: what `lm_eval --model hf` runs) on a Hugging Face model directory, and the
    seconds they took. ImportError where lm_eval is not installed or does not import (0.4.9 needs transformers 4)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=model_dir, batch_size=batch_size, device=str(device), dtype=dtype)
    pairs = [pair for doc in docs for pair in doc.requests]
    instances = [Instance(request_type='loglikelihood', doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)]
    t0 = time.perf_counter()
    scores = [loglik for loglik, _ in lm.loglikelihood(instances, disable_tqdm=True)]
    return scores, time.perf_counter() - t0


def bench_harness(args, device):
    """eval_zeroshot's batched scoring against lm-evaluation-harness's on a real model (--harness_model, a Hugging
    Face directory such as scripts/gguf_to_hf.py --gguf=smollm2 writes): the same synthetic docs as text, each side
    tokenizing them itself; their log-likelihoods must agree (the last column)."""
    if args.harness_model is None:
        return log('  harness: skipped: give --harness_model=DIR, a Hugging Face model directory')
    dtype = 'bfloat16' if device.type == 'cuda' else 'float32'
    docs = synthetic_docs(args.eval_docs)
    model, enc = load_model_and_tokenizer(args.harness_model, None, device, getattr(torch, dtype))
    requests = encode_docs('synthetic', docs, enc, model.config.block_size)
    score_requests(model, requests[:args.eval_batch_size], args.eval_batch_size)  # warm-up
    t0 = time.perf_counter()
    ours = score_requests(model, requests, args.eval_batch_size, Progress('  harness: eval_zeroshot', len(requests)))
    t_ours = time.perf_counter() - t0
    del model
    try:
        theirs, t_theirs = harness_loglikelihoods(args.harness_model, docs, args.eval_batch_size, device, dtype)
    except Exception as e:  # lm_eval 0.4.9 does not import with transformers 5 (AutoModelForVision2Seq is gone)
        return log(f'  harness: skipped: lm-evaluation-harness did not run here: {type(e).__name__}: {e}')
    print_table('Zero-shot evaluation: eval_zeroshot vs lm-evaluation-harness on a real model',
                f'{args.harness_model}, {dtype}, {len(docs)} synthetic 4-choice docs ({len(requests)} requests) as text; '
                f'batch size {args.eval_batch_size} on both sides: eval_zeroshot.score_requests and lm-eval '
                f'0.4.9\'s HFLM.loglikelihood (each tokenizing the text itself).',
                ['docs', 'eval_zeroshot docs/s', 'lm-eval docs/s', 'speedup', 'max abs loglik diff'],
                [[str(len(docs)), f'{len(docs) / t_ours:.1f}', f'{len(docs) / t_theirs:.1f}', ratio(t_theirs, t_ours),
                  f'{max(abs(a - b) for a, b in zip(ours, theirs)):.1e}']])

# -----------------------------------------------------------------------------
# The memory plan measured: one training step on fake tensors


def fake_gpt(config, device, dtype=torch.float32):
    """A GPT of config in dtype on device, in the active FakeTensorMode (which must allow non-fake inputs): shapes and
    dtypes without memory or initialisation. It is built on the meta device outside the mode (a fake module's .to()
    cannot swap its parameters); to_empty gives every parameter a tensor of its own, so a tied lm_head is tied
    again."""
    with unset_fake_temporarily(), torch.device('meta'):
        model = GPT(config).to(dtype)
    model.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def fake_peak_memory(c, model_config, teacher_config):
    """Peak bytes one rank allocates in a micro-step of train.py's run c (its dtype, micro-batch, DDP or FSDP over
    dry_run_world_size ranks, activation checkpointing, KD) of a model_config student and a teacher_config teacher
    (None: cross-entropy): torch's MemTracker on fake tensors, real shapes without memory, seconds per layer on a CPU.
    The micro-step is train.py's (compute_loss, then backward), with the gradients and AdamW's state already there (every
    micro-step's but a run's first). DDP runs unwrapped (its C++ reducer reads real data), its gradients allocated
    once, as common.wrap_ddp makes them DDP's buckets; FSDP is common.apply_fsdp over a fake process group, this rank 0. CPU
    kernels stand in for CUDA's (flash attention saves the same tensors); the KD loss's bf16 GEMMs write float32 as on
    sm_80+ GPUs (distill.fp32_output_gemm). Every allocation is rounded up to 512 bytes, as by the CUDA allocator;
    kernels' workspaces, the CUDA context and fragmentation are not seen."""
    dtype = plan_dtype(c)
    dist.init_process_group('fake', rank=0, world_size=c['dry_run_world_size'])
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), \
                mock.patch.object(distill, 'fp32_output_gemm', lambda device, dtype: True):
            student = fake_gpt(model_config, 'cpu')
            for layer in student.model.layers:
                layer.activation_checkpointing = c['activation_checkpointing']
            # MemTracker hooks the gradients of every module that runs and refuses frozen parameters: the teacher's
            # require grad here, and get none (compute_loss runs it under no_grad)
            teacher = fake_gpt(teacher_config, 'cpu', getattr(torch, dtype)).eval() if teacher_config else None
            if c['fsdp']:
                with unset_fake_temporarily():  # FSDP builds its device mesh from a real tensor of ranks
                    apply_fsdp(student, dtype)
            optimizer = configure_optimizers(student, c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']))
            for p in student.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()  # AdamW's state
            x = torch.zeros(c['micro_batch_size'], model_config.block_size, dtype=torch.long)
            autocast = torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bfloat16')
            tracker = MemTracker()
            tracker.track_external(student, teacher, optimizer)
            with tracker, warnings.catch_warnings():
                # FSDP reduce-scatters and frees a layer's unsharded gradients before MemTracker's hook, which reads
                # them after accumulation, looks: a warning that it got None (they were counted when made)
                warnings.filterwarnings('ignore', 'Expected a tensor or a traceable wrapper-subclass')
                with autocast:
                    loss = compute_loss(student, student, teacher, x, x, c)[0]
                loss.backward()
    finally:
        dist.destroy_process_group()
    return tracker.get_tracker_snapshot('peak')[torch.device('cpu')]['Total']

# -----------------------------------------------------------------------------
# --check: one command that validates a GPU machine end to end, before a long run


ONE_B_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config', 'affine_1b.py')
H100_BF16_PEAK = KNOWN_PEAK_BF16['H100']  # NVIDIA H100 SXM datasheet, dense bf16: what nanochat's MFU uses


def holds_mfu_target(gpu_name):
    """Whether --check holds a GPU to its MFU target: the GPUs of the H100 SXM's dense bf16 peak (common's table:
    H100 SXM, H200; not the H100 PCIe, 756 TFLOP/s), over which the MFU is taken."""
    return next((peak for key, peak in KNOWN_PEAK_BF16.items() if key in gpu_name), None) == H100_BF16_PEAK


def is_check_record(path):
    """Whether path holds a JSON record that --check wrote."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {'device', 'torch', 'rows'} <= set(record)


class Check:
    """The rows of the --check table; every row is also appended to the JSON file as soon as it is measured, so a
    run that is cut short keeps what it measured. ok: True / False for a pass-fail check, None for a report."""

    def __init__(self, json_path, header):
        if os.path.exists(json_path) and not is_check_record(json_path):
            raise RunError(f"--check_json={json_path}: holds something else than an earlier --check record, which "
                           f"this run would write over; give another path")
        self.json_path, self.record = json_path, dict(header, rows=[])
        self.save()

    def add(self, section, check, ok, value, target='', **data):
        self.record['rows'].append(dict(section=section, check=check, ok=ok, value=value, target=target, **data))
        self.save()
        log(f'  [{ {True: "PASS", False: "FAIL", None: "info"}[ok]}] {section}: {check}: {value}')

    def save(self):
        write_json(self.json_path, self.record)

    def failed(self):
        return [r for r in self.record['rows'] if r['ok'] is False]

    def print(self):
        rows = [[r['section'], r['check'], {True: 'pass', False: '**FAIL**', None: '-'}[r['ok']], str(r['value']),
                 str(r['target'])] for r in self.record['rows']]
        print_table(f"bench.py --check on {self.record['device']}",
                    f"torch {self.record['torch']}; {len(self.failed())} failed of "
                    f"{sum(r['ok'] is not None for r in self.record['rows'])} pass/fail checks; JSON: {self.json_path}",
                    ['section', 'check', 'result', 'measured', 'target'], rows)


def last_line(run):
    """The last line a finished subprocess printed: on stdout, else on stderr (where a crash before any output goes)."""
    return (run.stdout.strip().splitlines() or run.stderr.strip().splitlines() or ['no output'])[-1]


def check_kernel_tests(check, device):
    """The test suite's fast-path-vs-float64-reference tests, run by pytest: on CUDA the CUDA ones (every variant
    forward and backward, bf16 and fp32, with GQA; grouped K/V reaching the kernels; fp32 GQA memory; the KD loss in
    training precision), on CPU the float32 attention references and the KD loss in training precision."""
    kd_tests = 'fused_kd_loss_in_training_precision and ' + device.type
    suites = ([('tests/test_model.py', 'cuda'), ('tests/test_distill.py', kd_tests)] if device.type == 'cuda' else
              [('tests/test_model.py', 'explicit_reference and float32 and not cuda'),
               ('tests/test_distill.py', kd_tests)])
    root = os.path.dirname(os.path.abspath(__file__))
    pytest = subprocess.run([sys.executable, '-m', 'pytest', '--version'], cwd=root, capture_output=True, text=True)
    if pytest.returncode:  # requirements.txt alone installs no pytest (and pytest >= 8.4 needs pygments)
        check.add('kernels', 'the kernel tests (pytest)', None,
                  f'skipped: pytest does not run here ({last_line(pytest)}); pip install -r requirements-test.txt',
                  'all pass')
        return
    for path, expression in suites:
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', path, '-k', expression],
                             cwd=root, capture_output=True, text=True)
        summary = last_line(run)
        passed = re.search(r'(\d+) passed', summary)
        ok = run.returncode == 0 and passed is not None
        check.add('kernels', f'{path} -k "{expression}"', ok, f'{summary} ({time.perf_counter() - t0:.0f} s)',
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
    """Memory and compiled graphs of the models just measured released. A fresh dynamo cache for the next model: one
    shared with the last models would count their graphs towards its recompile limit (8), which --check, raising it,
    once hid a per-layer recompilation behind."""
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def dynamo_events():
    """(graphs dynamo compiled, graph breaks) in this process so far."""
    return counters['stats']['unique_graphs'], sum(counters['graph_break'].values())


def add_compile_row(check, section, what, before, first, timed):
    """A row for a compiled step from dynamo_events() before its first run, after it, and after the timed runs: it
    compiles at its first run only, and breaks no graph."""
    recompiles, breaks = timed[0] - first[0], timed[1] - before[1]
    check.add(section, f'{what}: compiled at the first step only, no graph break', recompiles == breaks == 0,
              f'{first[0] - before[0]} graphs at the first step; then {recompiles} more, {breaks} graph breaks',
              'none after the first step; no graph break')


def ddp_gradient_copies(ddp):
    """How many gradient storages a DDP-wrapped model holds beside DDP's all-reduce buckets: 0 when every .grad is a
    view into a bucket (common.wrap_ddp), also after no_sync micro-steps, which otherwise give each parameter a
    gradient of its own: a second copy of every gradient (4.6 GiB at 1B) until the synchronising micro-step."""
    buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    return len({p.grad.untyped_storage().data_ptr() for p in ddp.parameters() if p.grad is not None}) - buckets


def check_ddp(check, device, workdir):
    """common.wrap_ddp on this device (a one-rank process group): after a no_sync micro-step (the first of two, as in
    train.py's loop), every gradient is a view into DDP's all-reduce buckets, none a second copy beside them (ddp_gradient_copies)."""
    dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo',
                            init_method=f"file://{os.path.join(workdir, 'ddp_init')}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        config = ModelConfig(**MODEL_SHAPES['tiny'])
        with torch.device(device):
            model = GPT(config)
            x = torch.randint(0, config.vocab_size, (2, config.block_size + 1))
        ddp = wrap_ddp(model, device)
        with ddp.no_sync():
            with autocast(device):
                loss = compute_loss(ddp, model, None, x[:, :-1], x[:, 1:], {})[0]
            (loss / 2).backward()
        copies = ddp_gradient_copies(ddp)
    finally:
        dist.destroy_process_group()
    check.add('DDP', 'gradients kept once: views into the buckets after a no_sync micro-step', copies == 0,
              f'{copies} gradient storages beside the buckets', '0')


def check_variants(check, device, args):
    """One training step (forward + backward) of every variant at the 1B shape of config/affine_1b.py, T = 2048,
    bf16 autocast, decoder layers compiled as train.py compiles them; vs softmax and vs Eq. 6 with an explicit T x T
    matrix. One variant in memory at a time (a 1B model with its gradients is 10 GB)."""
    shape = {key: value for key, value in load_config([ONE_B_CONFIG]).items() if key in FIELD_NAMES}
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
            log(f'  variants: {variant:<24} {seconds * 1e3:8.1f} ms  {mem.peak / 2**30:6.2f} GiB  (compile {compile_s:.0f} s)')
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
        limit = None if variant == EXPLICIT or config.is_gated else config.variant.check_time
        check.add('variants (1B, T=2048)', f'{variant}: fwd+bwd, batch {B}',
                  None if limit is None else time_ratio <= limit,
                  f'{seconds * 1e3:.1f} ms ({time_ratio:.3f}x softmax), peak {peak / 2**30:.2f} GiB '
                  f'({mem_ratio:.2f}x)', f'<= {limit}x softmax' if limit else '', seconds=seconds, peak_bytes=peak)
        add_compile_row(check, 'variants (1B, T=2048)', variant, *events)
    if results.get(EXPLICIT) and results.get(PROPOSED):
        check.add('variants (1B, T=2048)', f'{PROPOSED} O(T) vs explicit T x T {PROPOSED}', None,
                  f'{ratio(results[PROPOSED][0], results[EXPLICIT][0])}x the time, '
                  f'{ratio(results[PROPOSED][1], results[EXPLICIT][1])}x the peak memory')


def check_kd(check, device, args):
    """fused_kd_loss vs the naive bf16 KD (both models' full bf16 logits, log-softmax in fp32) at V = 128,256, in the
    dtypes of a DDP bf16 run (student hidden states and lm_head fp32 under autocast, teacher's bf16): forward +
    backward, median time and peak memory."""
    N, V = args.kd_tokens, 128256
    h_s, w_s, paths = kd_problem(N, V, 2048, 3072, device, torch.float32)  # Llama-3.2-1B and -3B widths
    results = {}
    for name, step in paths.items():
        try:
            seconds = time_cuda(step, 5)
            h_s.grad = w_s.grad = None  # freed before the measurement: the step's own gradients count in its peak
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
    agree = abs(fused[2] - base[2]) / abs(base[2]) < 1e-2 and rel(fused[3], base[3]) < 2e-2 and rel(fused[4], base[4]) < 2e-2
    check.add('KD loss (V=128,256)', f'fused vs naive bf16: value and gradients agree, {N} tokens', agree,
              f'loss {fused[2]:.5f} vs {base[2]:.5f}; grad rel. diff h {rel(fused[3], base[3]):.1e}, '
              f'W {rel(fused[4], base[4]):.1e}', 'within bf16 rounding (1e-2, 2e-2)')
    check.add('KD loss (V=128,256)', 'fused time vs naive bf16', fused[0] <= base[0],
              f'{fused[0] * 1e3:.1f} ms vs {base[0] * 1e3:.1f} ms ({fused[0] / base[0]:.2f}x)', '<= 1.00x')
    check.add('KD loss (V=128,256)', 'fused peak memory vs naive bf16', fused[1] <= 0.15 * base[1],
              f'{fused[1] / 2**30:.2f} GiB vs {base[1] / 2**30:.2f} GiB ({fused[1] / base[1]:.3f}x)', '<= 0.15x')


def check_torchrun(check, device, args, workdir):
    """train.py under torchrun on one device, with a KD teacher, for each variant at once (small models): a DDP run
    stopped by SIGTERM, resumed under FSDP, both compiled on CUDA. Checks: the signal saves the step reached, the
    resumed run continues from it and the loss curve continues, the loss falls, and the checkpoint loads on CPU."""
    cuda = device.type == 'cuda'
    variants = ATTENTIONS if cuda else (PROPOSED,)  # on CPU: the plumbing of one variant, in seconds
    if importlib.util.find_spec('datasets') is None:  # prepare_data.py reads even the built-in corpus through it
        check.add('torchrun', 'train.py under torchrun', None, 'skipped: prepare_data.py needs the datasets package '
                  '(pip install -r requirements.txt)', 'every variant runs')
        return
    data = os.path.join(workdir, 'data')
    with contextlib.redirect_stdout(sys.stderr):
        prepare_data.main(['--source=builtin', '--tokenizer=bytes', f'--out_dir={data}', '--val_every=10',
                           '--num_proc=1'])
    common = ['--n_layer=2', '--n_head=4', '--n_kv_head=2', '--n_embd=64', '--intermediate_size=128',
              '--vocab_size=320', '--block_size=64', '--global_batch_size=16', '--micro_batch_size=8',
              '--warmup_iters=5', '--learning_rate=3e-3', '--decay_frac=0.0', '--eval_batches=2', '--log_interval=1000',
              '--peak_flops=1e12', f'--device={device.type}', f'--data_dir={data}']
    root = os.path.dirname(os.path.abspath(__file__))

    def command(*extra):
        return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1', 'train.py',
                *common, *extra]

    def records(out_dir):  # read while the run appends: a line being written is left out
        path = os.path.join(out_dir, 'metrics.jsonl')
        return read_log(path) if os.path.exists(path) else []

    teacher = os.path.join(workdir, 'teacher')  # a teacher worth distilling: 60 steps of cross-entropy
    subprocess.run([sys.executable, 'train.py', *common, '--max_iters=60', '--eval_interval=60', '--compile=False',
                    f'--out_dir={teacher}'], cwd=root, check=True, capture_output=True)
    kd = [f'--teacher={teacher}', '--eval_interval=10', f'--compile={cuda}']
    stop_after = 12
    runs = {v: subprocess.Popen(command(*kd, f'--attention={v}', '--max_iters=100000',
                                        f'--out_dir={os.path.join(workdir, v)}'),
                                cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for v in variants}
    deadline, outputs = time.time() + 300, {}
    while runs and time.time() < deadline:
        for v, proc in list(runs.items()):
            if len(records(os.path.join(workdir, v))) >= stop_after or proc.poll() is not None:
                proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its worker
                outputs[v] = proc.communicate(timeout=300)[0]
                del runs[v]
        time.sleep(0.2)
    for proc in runs.values():
        proc.kill()
    resumed = {}
    for v in variants:
        out_dir = os.path.join(workdir, v)
        ckpt = os.path.join(out_dir, 'ckpt.pt')
        stopped = read_checkpoint(ckpt, keys=('step',))['step'] if os.path.exists(ckpt) else 0
        saved = stopped >= stop_after and len(records(out_dir)) == stopped and 'stopped by a signal' in outputs.get(v, '')
        check.add('torchrun', f'{v}: DDP run, SIGTERM saves the step reached', saved,
                  f'stopped at step {stopped}, {len(records(out_dir))} records', f'>= {stop_after}',
                  output=None if saved else outputs.get(v, 'timed out')[-3000:])
        if saved:
            resumed[v] = (stopped, subprocess.Popen(
                command(*kd, f'--attention={v}', f'--max_iters={stopped + 10}', '--fsdp=True', '--init_from=resume',
                        f'--out_dir={out_dir}'), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for v, (stopped, proc) in resumed.items():
        out = proc.communicate(timeout=600)[0]
        out_dir = os.path.join(workdir, v)
        losses = [r['loss'] for r in records(out_dir)]
        steps = [r['step'] for r in records(out_dir)]
        continued = proc.returncode == 0 and steps == list(range(1, stopped + 11))
        # the curve continues: the first resumed loss is nearer the last losses before the stop than the first ones
        before = losses[stopped - 3:stopped]
        jump = abs(losses[stopped] - sum(before) / 3) if continued else math.inf
        fell = losses[0] - (sum(losses[-3:]) / 3) if continued else -math.inf
        check.add('torchrun', f'{v}: FSDP resume continues the run', continued and jump < 0.25 * fell,
                  f'steps {stopped + 1}-{stopped + 10}; loss {losses[stopped - 1]:.3f} -> {losses[stopped]:.3f} '
                  f'across the restart' if continued else f'exit {proc.returncode}', 'jump < 1/4 of the fall',
                  output=None if continued else out[-3000:])
        check.add('torchrun', f'{v}: KD loss falls', continued and fell > 0.3,
                  f'{losses[0]:.3f} -> {sum(losses[-3:]) / 3:.3f}' if continued else '-', 'falls by > 0.3')
        if continued:
            model = load_teacher(out_dir, 'cpu')  # our checkpoint, on CPU, in float32
            windows = Windows(data, 'val', model.config.block_size)
            x, y = (torch.from_numpy(t) for t in windows.get(range(2 * 8)))
            with torch.no_grad():
                _, loss = model(x, y)
            logged = records(out_dir)[-1]['val_loss']
            check.add('torchrun', f'{v}: checkpoint loads on CPU', abs(loss.item() - logged) < 0.05,
                      f'CPU float32 val loss {loss.item():.4f}, logged on {device.type} {logged:.4f}',
                      'within 0.05 (bf16)')


def check_mfu(check, device, args):
    """Tokens/s and MFU of config/affine_1b.py's training step with a 3B-shaped teacher (Llama-3.2-3B's published
    shape, random bf16 weights), one GPU, at the largest micro-batch the memory plan lets fit: train.py's own
    micro-step (compute_loss, backward), gradient clipping and AdamW step, decoder layers compiled."""
    c = load_config([ONE_B_CONFIG])
    shape = {key: c[key] for key in FIELD_NAMES}
    cfg, T = ModelConfig(**shape), shape['block_size']
    teacher_cfg = ModelConfig(**KNOWN_TEACHERS['Llama-3.2-3B'] | dict(block_size=T))  # MODEL_SHAPES' llama3.2-3b
    gpu = torch.cuda.get_device_properties(device).total_memory
    fits = [b for b in (16, 12, 8, 6, 4, 2, 1)
            if sum(memory_estimate(cfg, 1, b, 'bfloat16', False, False, teacher_cfg).values()) <= 0.92 * gpu]
    torch.manual_seed(0)
    baseline = torch.cuda.memory_allocated(device)  # what earlier parts left: not this step's
    with torch.device(device):
        student = GPT(cfg)
        teacher = GPT(teacher_cfg).to(torch.bfloat16).eval().requires_grad_(False)
    compile_layers(student)
    compile_layers(teacher)
    optimizer = configure_optimizers(student, 0.1, 1e-4, (0.9, 0.95))
    c.update(kd_temperature=1.0, kd_alpha=1.0)
    accumulation = 2
    step_flops = flops_per_token(student, T) + flops_per_token(teacher, T) / 3  # teacher: forward only
    for B in fits:
        batches = [(x[:, :-1], x[:, 1:]) for x in (torch.randint(0, cfg.vocab_size, (B, T + 1), device=device)
                                                   for _ in range(accumulation))]

        def step():
            for x, y in batches:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = compute_loss(student, student, teacher, x, y, c)[0]
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
        section, peak = '1B affine KD step, 3B teacher', torch.cuda.max_memory_allocated(device) - baseline
        tokens = accumulation * B * T / seconds
        mfu = step_flops * tokens / H100_BF16_PEAK
        measured_peak = measured_matmul_flops(device, torch.bfloat16, gemm_shapes(student, B * T))
        check.add(section, f'micro-batch {B} x {T}, {accumulation} micro-steps + AdamW',
                  mfu >= 0.45 if holds_mfu_target(torch.cuda.get_device_name(device)) else None,
                  f'{tokens:,.0f} tokens/s, MFU {100 * mfu:.1f}% of 989 TFLOP/s ({100 * step_flops * tokens / measured_peak:.1f}% '
                  f'of the measured {measured_peak / 1e12:.0f}); peak {peak / 2**30:.1f} GiB; '
                  f'compile {compile_s:.0f} s', '>= 45% MFU (H100, H200)', tokens_per_sec=tokens, mfu=mfu,
                  step_seconds=seconds, micro_batch=B)
        # the dry run's plan for this step: one GPU (DDP's per-GPU memory does not depend on the ranks)
        plan = sum(memory_estimate(cfg, 1, B, 'bfloat16', False, False, teacher_cfg).values())
        check.add(section, 'peak memory vs the dry run\'s plan (memory_plan.memory_estimate)', peak <= plan,
                  f'{peak / 2**30:.1f} GiB allocated at the peak, plan {plan / 2**30:.1f} GiB ({peak / plan:.2f}x)',
                  '<= the plan', peak_bytes=peak, plan_bytes=plan)
        add_compile_row(check, section, 'student and teacher layers', before, first, dynamo_events())
        if cfg.variant.fp32:  # the variant's float32 buffers (affine's alpha_ma)
            dtypes = {getattr(layer.self_attn, name).dtype for layer in student.model.layers
                      for name in cfg.variant.fp32}
            check.add(section, f"{', '.join(cfg.variant.fp32)} after bf16 steps", dtypes == {torch.float32},
                      ', '.join(sorted(str(d) for d in dtypes)), 'torch.float32')
        return
    check.add('1B affine KD step, 3B teacher', 'a micro-batch that fits', False, f'none of {fits} fit')


def run_check(args):
    """python bench.py --check: the sections above, one table at the end, the JSON as it goes. Exit status 1 if a
    pass/fail check failed; 0 on a machine without a GPU after the CPU parts."""
    cuda = torch.cuda.is_available()
    device = torch.device('cuda' if cuda else 'cpu')
    name = torch.cuda.get_device_name(device) if cuda else f'CPU ({torch.get_num_threads()} threads), no GPU'
    check = Check(args.check_json, dict(device=name, torch=torch.__version__, date=time.strftime('%Y-%m-%d %H:%M')))
    log(f'bench.py --check on {name}, torch {torch.__version__}')
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        parts = [('kernels', lambda: check_kernel_tests(check, device)),
                 ('torchrun', lambda: check_torchrun(check, device, args, workdir))]
        if cuda:
            parts += [('ddp', lambda: check_ddp(check, torch.device('cuda', torch.cuda.current_device()), workdir)),
                      ('variants', lambda: check_variants(check, device, args)),
                      ('kd', lambda: check_kd(check, device, args)),
                      ('mfu', lambda: check_mfu(check, device, args))]
        for part, fn in parts:
            if args.check_parts and part not in args.check_parts:
                continue
            t0 = time.perf_counter()
            log(f'{part} ...')
            try:
                fn()
            except Exception as e:  # a broken part is a failed row, and the other parts still run
                check.add(part, 'ran to the end', False, f'{type(e).__name__}: {e}'[:300],
                          output=traceback.format_exc()[-4000:])
            log(f'{part}: {time.perf_counter() - t0:.0f} s')
            if cuda:
                free_cuda()
    if not cuda:
        check.add('GPU', 'CUDA device', None, 'none found: the GPU sections (DDP gradients, variants at 1B, KD at '
                  'V=128,256, MFU with the memory plan) were skipped', 'a GPU')
    check.record['seconds'] = time.perf_counter() - t_start
    check.save()
    check.print()
    return 1 if check.failed() else 0


SECTIONS = dict(attention=bench_attention, kd=bench_kd, train=bench_train, eval=bench_eval, harness=bench_harness,
                study=bench_study)
MEMORY_SECTIONS = ('attention', 'kd')  # they measure peak memory
CHECK_PARTS = ('kernels', 'torchrun', 'ddp', 'variants', 'kd', 'mfu')


KEYS = dict(
    check=Key(False, 'validate this machine end to end (see "--check" above) instead of the benchmark sections'),
    check_json=Key('bench_check.json', '--check: where its JSON record goes'),
    check_parts=Key(None, f"--check: only these parts ({', '.join(CHECK_PARTS)}); default all", choices=CHECK_PARTS,
                    types=(list,)),
    check_batch_size=Key(4, '--check: micro-batch of the 1B variant steps', min=1),
    sections=Key(list(SECTIONS), 'comma-separated', choices=tuple(SECTIONS)),
    device=DEVICE,
    compile=Key(None, 'torch.compile the timed training steps (default: on for CUDA, off for CPU)', types=(bool,)),
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
    study_steps=Key(100, "study: steps per train.py run (the study's runs have config/sink_study.py's max_iters)", min=6),
    study_threads=Key(1, "study: threads per process (the study's: cores / jobs)", min=1),
    # harness (needs lm-evaluation-harness 0.4.9, which needs transformers 4)
    harness_model=Key(None, 'harness: a Hugging Face model directory, e.g. what scripts/gguf_to_hf.py writes',
                      types=(str,)),
)


def parse_args(argv):
    args = types.SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS, __doc__, prog='bench.py'))
    args.device = str(resolve_device(args.device))
    cuda = args.device.startswith('cuda')
    args.compile = cuda if args.compile is None else args.compile
    args.train_batch_size = args.train_batch_size or (64 if cuda else 8)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.check:
        return run_check(args)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU, {torch.get_num_threads()} threads'
    print(f'# bench.py on {name}; torch {torch.__version__}; {dtype_name(device)}')
    # the memory sections first, in a fresh process: their CPU measurement needs a small mmap threshold
    for section in sorted(args.sections, key=lambda s: s not in MEMORY_SECTIONS):
        if device.type == 'cpu':
            set_mmap_threshold(128 * 1024 if section in MEMORY_SECTIONS else 32 * 2 ** 20)
        log(f'{section} ...')
        t0 = time.perf_counter()
        SECTIONS[section](args, device)
        log(f'{section}: {time.perf_counter() - t0:.0f} s')


if __name__ == '__main__':
    sys.exit(run_script(main))
