"""
Benchmark: one training step (forward + backward) per attention variant, side by side in one run,
as ratios to softmax. Includes "affine (explicit T x T)": what a user would write from Eq. 6 directly,
reusing the model's own q/k/v/alpha code, as the peer our O(T) implementation is compared against.

    python bench.py                          # whatever device is found (CPU: float32 eager; CUDA: bf16 + compile)
    python bench.py --seq_lens=1024,2048 --steps=5 --n_layer=4 --n_embd=512

Peak memory: CUDA's allocator peak on GPU; on CPU the rise of the process's peak resident set size
during the step (VmHWM, reset through /proc/self/clear_refs), with glibc's mmap threshold pinned so
every freed tensor really leaves the process.
"""
import argparse
import math
import os
import re
import statistics
import sys
import time
import types

if sys.platform == 'linux' and os.environ.get('MALLOC_MMAP_THRESHOLD_') is None:
    # glibc otherwise raises its mmap threshold after the first big free and keeps later tensors on the
    # heap, so resident memory would stop tracking live tensors: restart once with it pinned.
    os.environ['MALLOC_MMAP_THRESHOLD_'] = '131072'
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch

from model import GPT, ModelConfig


def explicit_affine_forward(self, x, cos, sin, positions, seq_lens=None, cache=None):
    """Eq. 6-8 as written: build A = alpha * softmax(QK^T/sqrt(d)) + beta on the visible keys, then A V."""
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


def bench_attention_variants(args, device):
    """Per sequence length: build every variant, then time them in interleaved rounds (one step of each
    per round, median over rounds), so drift in machine load hits all variants alike."""
    use_bf16 = device.type == 'cuda'
    variants = ['softmax', 'sink', 'gated', 'affine', 'affine_gated', 'affine (explicit T x T)']
    rows = []
    for T in args.seq_lens:
        steps = {}
        for variant in variants:
            cfg = ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_kv_head, n_embd=args.n_embd,
                              intermediate_size=args.n_embd * 8 // 3 // 64 * 64, vocab_size=args.vocab_size,
                              block_size=T, attention=variant.split(' ')[0])
            torch.manual_seed(0)
            model = GPT(cfg).to(device)
            if variant.endswith('(explicit T x T)'):
                for layer in model.model.layers:
                    layer.self_attn.forward = types.MethodType(explicit_affine_forward, layer.self_attn)
            step_model = torch.compile(model) if args.compile else model
            idx = torch.randint(0, cfg.vocab_size, (args.batch_size, T), device=device)

            def step(model=model, step_model=step_model, idx=idx):
                model.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    _, loss = step_model(idx, idx)
                loss.backward()
                if device.type == 'cuda':
                    torch.cuda.synchronize()
                model.zero_grad(set_to_none=True)

            step()  # warm-up (and compilation)
            steps[variant] = step
        times = {v: [] for v in variants}
        for _ in range(args.steps):
            for variant in variants:
                t0 = time.perf_counter()
                steps[variant]()
                times[variant].append(time.perf_counter() - t0)
        for variant in variants:
            with PeakMemory(device) as mem:
                steps[variant]()
            rows.append((variant, T, statistics.median(times[variant]), mem.peak))
            print(f'  measured {variant:<24} T={T:<5} {rows[-1][2] * 1e3:9.1f} ms {mem.peak / 2**20:9.1f} MiB',
                  file=sys.stderr)
        del steps
    base = {T: (t, m) for v, T, t, m in rows if v == 'softmax'}
    print('\n| variant | T | fwd+bwd (ms) | time / softmax | peak mem (MiB) | mem / softmax |')
    print('|---|---|---|---|---|---|')
    for v, T, t, m in rows:
        print(f'| {v} | {T} | {t * 1e3:.1f} | {t / base[T][0]:.2f} | {m / 2**20:.1f} | {m / base[T][1]:.2f} |')


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--seq_lens', default='1024,2048', type=lambda s: [int(x) for x in s.split(',')])
    p.add_argument('--steps', type=int, default=3, help='timed rounds (one step of every variant each; median reported)')
    p.add_argument('--batch_size', type=int, default=1)
    p.add_argument('--n_layer', type=int, default=4)
    p.add_argument('--n_embd', type=int, default=512)
    p.add_argument('--n_head', type=int, default=8)
    p.add_argument('--n_kv_head', type=int, default=2)
    p.add_argument('--vocab_size', type=int, default=8192)
    p.add_argument('--compile', type=lambda s: s.lower() in ('1', 'true', 'yes'), default=None,
                   help='torch.compile the model (default: on for CUDA, off for CPU)')
    args = p.parse_args()
    device = torch.device(args.device)
    if args.compile is None:
        args.compile = device.type == 'cuda'
    dtype = 'bf16 autocast' if device.type == 'cuda' else 'float32'
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU, {torch.get_num_threads()} threads'
    print(f'# bench.py on {name}; torch {torch.__version__}; {dtype}; compile={args.compile}; '
          f'model n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head} n_kv_head={args.n_kv_head} '
          f'vocab={args.vocab_size}; batch {args.batch_size}; median of {args.steps} interleaved rounds')
    print('# sink runs the LSE-corrected flash kernel on CPU and CUDA (an explicit T x T fallback elsewhere)')
    bench_attention_variants(args, device)


if __name__ == '__main__':
    main()
