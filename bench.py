"""
Benchmarks, measured side by side in one run on whatever device is found: CPU runs float32 eager; CUDA runs
bf16 autocast, with torch.compile where a training step is timed. Each section prints a Markdown table under
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
  train      tokens/s and MFU of real AdamW steps of a small model: GPT.flops_per_token x tokens/s over the
             device's measured matmul peak (train.measured_matmul_flops)
  eval       docs/s of eval_zeroshot's batched scoring vs one request per forward, synthetic 4-choice docs

Peak memory: CUDA's allocator peak (max_memory_allocated) on GPU; on CPU the rise of the process's peak
resident set size during the measured step (VmHWM, reset through /proc/self/clear_refs), with glibc's mmap
threshold pinned so that every freed tensor really leaves the process.
"""
import argparse
import ctypes
import math
import os
import random
import re
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

from distill import fused_kd_loss
from eval_zeroshot import (Progress, choice_doc, encode_docs, plan_forwards, score_one_by_one, score_requests,
                           shares_prefixes)
from model import ATTENTIONS, FIELD_NAMES, GPT, ModelConfig
from prepare_data import load_tokenizer
from train import default_peak_flops, load_config, measured_matmul_flops

EXPLICIT = 'affine (explicit T x T)'
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


def explicit_affine_forward(self, x, cos, sin, *unused):
    """Eq. 6-8 as written: build A = alpha * softmax(QK^T/sqrt(d)) + beta on the visible keys, then A V.
    Attention.forward's other arguments (positions, padding, KV cache, ...) go unused: the bench runs whole
    sequences without padding or a cache."""
    B, T, _ = x.shape
    q, k, v = self.project(x, cos, sin)
    G = self.config.n_head // self.config.n_kv_head
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    visible = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    weights = torch.softmax(scores.masked_fill(~visible, float('-inf')), dim=-1)
    alpha = self.scale(x).transpose(1, 2).unsqueeze(-1)  # (B, H, T, 1)
    beta = (self.alpha_ma.view(1, -1, 1, 1) - alpha) / T
    A = alpha * weights + beta * visible
    y = (A.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, -1)
    return self.o_proj(y)


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
                    layer.self_attn.forward = types.MethodType(explicit_affine_forward, layer.self_attn)
            step_model = torch.compile(model) if args.compile else model
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


def bench_kd(args, device):
    """One forward + backward of pure KD (T = 1) per path, on random hidden states and lm_heads; in training
    dtypes on CUDA (bf16 hidden states and teacher head, float32 student head, autocast)."""
    N, V, C = args.kd_tokens, args.kd_vocab, args.kd_hidden
    low = torch.bfloat16 if device.type == 'cuda' else torch.float32
    torch.manual_seed(0)
    h_s = torch.randn(N, C, device=device, dtype=low, requires_grad=True)
    w_s = (torch.randn(V, C, device=device) * C ** -0.5).requires_grad_()
    h_t = torch.randn(N, C, device=device, dtype=low)
    w_t = (torch.randn(V, C, device=device) * C ** -0.5).to(low)
    paths = {
        # what one writes first: both models' full logits, then the KL
        'naive': lambda: F.kl_div(F.log_softmax(h_s @ w_s.T, dim=-1), F.log_softmax(h_t @ w_t.T, dim=-1),
                                  log_target=True, reduction='batchmean'),
        'fused_kd_loss': lambda: fused_kd_loss(h_s, w_s, h_t, w_t)[0],
    }
    # at its peak the naive path holds five N x V float32 tensors (the saved log-softmaxes and the KL's terms,
    # forward and backward alike): 19.57 GiB at the default sizes, where 19.58 GiB was measured on CPU
    estimate, available = 5 * N * V * 4, available_memory(device)
    results = {}
    for name, loss_fn in paths.items():
        if name == 'naive' and estimate > available:
            log(f'  kd: naive skipped: it needs ~{estimate / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available')
            continue

        def step():
            with autocast(device):
                loss = loss_fn()
            loss.backward()
            return loss.item()

        if device.type == 'cuda':
            step()  # warm-up: CUDA context, cuBLAS workspaces
        h_s.grad = w_s.grad = None  # the previous step's gradients are freed before the measurement, not in it
        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            loss = step()  # .item() waits for the device
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
    two warm-up steps (compilation, AdamW's state). MFU as train.py logs it (GPT.flops_per_token), over the
    measured matmul peak."""
    B, T = args.train_batch_size, args.train_seq_len
    dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32
    peak = measured_matmul_flops(device, dtype)
    rows = []
    for variant in args.variants:
        torch.manual_seed(0)
        model = GPT(model_config(args, variant, T)).to(device)
        optimizer = model.configure_optimizers(weight_decay=0.1, lr=1e-4, betas=(0.9, 0.95))
        step_model = torch.compile(model) if args.compile else model
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
        rows.append((variant, model.get_num_params(), dt, model.flops_per_token(T) * B * T / dt))
        log(f'  train: {variant:<14} {dt * 1e3:9.1f} ms/step {B * T / dt:10,.0f} tokens/s')
    # measured before and after: on a shared machine one measurement can land in a busy moment
    peak = max(peak, measured_matmul_flops(device, dtype))
    rows = [[variant, f'{params:,}', f'{dt * 1e3:.1f}', f'{B * T / dt:,.0f}', f'{flops / 1e12:.3f}',
             f'{100 * flops / peak:.1f}%'] for variant, params, dt, flops in rows]
    print_table('Training throughput',
                f'Model {model_shape(args)}, batch {B} x {T} tokens, {args.train_steps} timed AdamW steps; '
                f'{dtype_name(device)}, compile={args.compile}. MFU = GPT.flops_per_token x tokens/s over the '
                f'measured matmul peak, {peak / 1e12:.2f} TFLOP/s (train.measured_matmul_flops, best of 5 before and 5 after)'
                + (f'; the peak train.py uses for its MFU on this GPU is {default_peak_flops(device, dtype) / 1e12:.0f} '
                   f'TFLOP/s.' if device.type == 'cuda' else '.'),
                ['variant', 'params', 'step (ms)', 'tokens/s', 'model TFLOP/s', 'MFU'], rows)

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
        forwards = len(set(plan_forwards(requests, shares_prefixes(config))))
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

# -----------------------------------------------------------------------------


SECTIONS = dict(attention=bench_attention, kd=bench_kd, train=bench_train, eval=bench_eval)
MEMORY_SECTIONS = ('attention', 'kd')  # they measure peak memory


def comma_list(choices=None, kind=str):
    def parse(text):
        values = [kind(v) for v in text.split(',')]
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument('--sections', type=comma_list(SECTIONS), default=list(SECTIONS))
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--compile', type=lambda s: s.lower() in ('1', 'true', 'yes'), default=None,
                   help='torch.compile the timed training steps (default: on for CUDA, off for CPU)')
    g = p.add_argument_group('the model of the attention and train sections')
    g.add_argument('--n_layer', type=int, default=4)
    g.add_argument('--n_embd', type=int, default=512)
    g.add_argument('--n_head', type=int, default=8)
    g.add_argument('--n_kv_head', type=int, default=2)
    g.add_argument('--vocab_size', type=int, default=8192)
    g = p.add_argument_group('attention')
    g.add_argument('--seq_lens', type=comma_list(kind=int), default=[1024, 2048])
    g.add_argument('--steps', type=int, default=7, help='timed rounds (one step of every variant each; median)')
    g.add_argument('--batch_size', type=int, default=1)
    g = p.add_argument_group('kd')
    g.add_argument('--kd_tokens', type=int, default=8192)
    g.add_argument('--kd_vocab', type=int, default=128256)
    g.add_argument('--kd_hidden', type=int, default=2048)
    g = p.add_argument_group('train and eval')
    g.add_argument('--variants', type=comma_list(ATTENTIONS), default=['softmax', 'affine'])
    g.add_argument('--train_steps', type=int, default=10)
    g.add_argument('--train_batch_size', type=int, default=None, help='default: 8 on CPU, 64 on CUDA')
    g.add_argument('--train_seq_len', type=int, default=256)
    g.add_argument('--eval_docs', type=int, default=200)
    g.add_argument('--eval_batch_size', type=int, default=32)
    args = p.parse_args(argv)
    cuda = args.device.startswith('cuda')
    args.compile = cuda if args.compile is None else args.compile
    args.train_batch_size = args.train_batch_size or (64 if cuda else 8)
    return args


def main(argv=None):
    args = parse_args(argv)
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
    main()
