"""
Train a student with the paper's recipe (Section 5.1, Appendix B.1), on one CPU or many GPUs.

    python train.py config/tiny_cpu.py --data_dir=data/builtin_bytes --max_iters=200      # a laptop CPU
    torchrun --standalone --nproc_per_node=8 train.py config/affine_1b.py                # one 8-GPU node
    python train.py config/affine_1b.py --dry_run=True                                    # parameter counts only

Configuration, nanoGPT-style: the defaults below, then each config file (plain assignments), then
--key=value overrides (Python literals: 3e-4, None, True, [1, 2], {'a': 1}; anything else is a string).
Unknown keys and wrong types are errors. The resolved config is written to out_dir/config.json.

Data: step s trains on windows perm[s*G : (s+1)*G] of the train split (prepare_data.Windows), G the global
batch, perm a permutation seeded by (seed, epoch): every window once per epoch (the paper trains one epoch),
and a step's data depends only on (seed, step), never on the number of ranks or the micro-batch size. The
position to resume from is therefore just the step.
"""
import ast
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import FIELD_NAMES, GPT, ModelConfig
from prepare_data import Windows, read_meta

# -----------------------------------------------------------------------------------------------
# Defaults: the paper's recipe. Model keys (ModelConfig's fields) come from the config file.
DEFAULTS = dict(
    out_dir='out',
    data_dir='data/fineweb_edu_llama3',  # a prepare_data.py output directory
    init_from='scratch',  # 'scratch' | 'resume' (continue from out_dir/ckpt.pt, bit-exactly)
    max_iters=9000,  # optimizer steps (Appendix B.1)
    global_batch_size=1024,  # sequences per optimizer step, over all ranks (Section 5.1)
    micro_batch_size=8,  # sequences per forward on one rank; accumulation steps are derived
    learning_rate=1e-3,  # Section 5.1 (swept 5e-4 ... 5e-3)
    min_lr=0.0,  # learning rate at the end of the decay
    warmup_iters=100,  # warmup-stable-decay schedule (Appendix B.1)
    decay_frac=0.2,  # the last 20% of the steps decay linearly to min_lr (the paper gives no number)
    weight_decay=0.1,  # Section 5.1
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # clip the global gradient norm (0: off); metrics log the norm before clipping
    seed=1337,
    eval_interval=500,  # evaluate, log attention statistics and save a checkpoint every this many steps
    eval_batches=20,  # validation batches of micro_batch_size sequences, split over ranks
    log_interval=10,  # console line every this many steps (metrics.jsonl gets every step)
    nonfinite='stop',  # non-finite loss/grad norm: 'stop' with an error, or 'skip' the step and count it
    device='auto',  # 'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...
    dtype='auto',  # 'auto' (bfloat16 autocast on GPUs that support it, else float32) | float32 | bfloat16
    compile=None,  # torch.compile; None: on for CUDA, off for CPU
    peak_flops=None,  # per-device peak FLOP/s for MFU; None: a table for known GPUs, else a measured matmul peak
    teacher=None,  # knowledge distillation from a teacher (a Hugging Face directory or one of our checkpoints)
    kd_temperature=1.0,
    kd_alpha=1.0,  # loss = kd_alpha * KD + (1 - kd_alpha) * CE; 1.0 is the paper's pure KD
    wandb_log=False,
    wandb_project='affine-scaled-attention',
    wandb_run_name=None,
    dry_run=False,  # build the model on the meta device, print its parameter counts, exit
)
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
# Keys whose default is None (or a dict) and the types they may also take; every other key takes the
# type of its default (an int is accepted where a float is expected).
NULLABLE = dict(compile=(bool,), peak_flops=(float, int), teacher=(str,), wandb_run_name=(str,), rope_scaling=(dict,))
CHOICES = dict(init_from=('scratch', 'resume'), nonfinite=('stop', 'skip'),
               dtype=('auto', 'float32', 'bfloat16'))


def check_value(key, value, where):
    """The value, validated against the key's type (ints are widened to float); a clear error otherwise."""
    default = {**DEFAULTS, **MODEL_DEFAULTS}[key]
    allowed = NULLABLE[key] + (type(None),) if key in NULLABLE else (type(default),)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = ' or '.join(t.__name__ for t in allowed)
        raise SystemExit(f"{where}: {key}={value!r} has type {type(value).__name__}, expected {names}")
    if key in CHOICES and value not in CHOICES[key]:
        raise SystemExit(f"{where}: {key}={value!r}; valid values: {', '.join(CHOICES[key])}")
    return value


def load_config(argv):
    """Defaults <- config files <- --key=value overrides, each key checked."""
    config = {**DEFAULTS, **MODEL_DEFAULTS}
    valid = 'valid keys: ' + ', '.join(sorted(config))
    for arg in argv:
        if arg.startswith('--'):
            key, sep, text = arg[2:].partition('=')
            if not sep:
                raise SystemExit(f"{arg}: overrides are written --key=value")
            if key not in config:
                raise SystemExit(f"unknown config key {key!r} in {arg}; {valid}")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare word is a string: --attention=affine
            config[key] = check_value(key, value, arg)
        else:
            if not os.path.isfile(arg):
                raise SystemExit(f"config file {arg} not found")
            values = {}
            exec(open(arg).read(), {}, values)
            for key, value in values.items():
                if key not in config:
                    raise SystemExit(f"{arg}: unknown config key {key!r}; {valid}")
                config[key] = check_value(key, value, arg)
    return config


# -----------------------------------------------------------------------------------------------
# Schedule, checkpoints, measurements

def learning_rate(step, c):
    """Warmup-stable-decay: linear warmup, constant, then linear decay to min_lr over the last decay_frac."""
    if step < c['warmup_iters']:
        return c['learning_rate'] * (step + 1) / c['warmup_iters']
    decay_start = int(c['max_iters'] * (1 - c['decay_frac']))
    if step < decay_start:
        return c['learning_rate']
    progress = (step - decay_start) / max(1, c['max_iters'] - decay_start)
    return c['learning_rate'] + (c['min_lr'] - c['learning_rate']) * progress


def save_checkpoint(path, state):
    """Atomic: write a temp file, fsync, rename. A crash mid-save leaves the previous checkpoint intact."""
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state):
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if state['cuda'] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


KNOWN_PEAK_BF16 = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'L40S': 362e12, 'A10G': 125e12, '4090': 165e12}


def default_peak_flops(device, dtype):
    """Dense peak FLOP/s of one device: datasheet values for known GPUs (bf16), else measured with a matmul."""
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
        for key, flops in KNOWN_PEAK_BF16.items():
            if key in name:
                return flops
    n = 1024 if device.type == 'cpu' else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    a @ a  # warm-up
    if device.type == 'cuda':
        torch.cuda.synchronize()
    t0, reps = time.perf_counter(), 5
    for _ in range(reps):
        a @ a
    if device.type == 'cuda':
        torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


@torch.no_grad()
def mean_attention_logit(model, idx):
    """Mean of q_i.k_j/sqrt(d) over layers, heads and causal pairs j <= i (paper Figure 2), and of its
    absolute value, on one sequence. Uses the model's own q/k projections; the T x T logits are built
    one layer at a time for this one sequence only."""
    inputs = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda m, args: inputs.append(args[:3]))
             for layer in model.model.layers]
    was_training = model.training
    model.eval()  # eval mode: affine must not count this sequence in alpha_ma's next update
    try:
        model(idx[:1])
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    signed, absolute = [], []
    for layer, (x, cos, sin) in zip(model.model.layers, inputs):
        q, k, _ = layer.self_attn.project(x, cos, sin)
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
        visible = torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device).tril()
        signed.append(logits[..., visible].mean().item())
        absolute.append(logits[..., visible].abs().mean().item())
    return sum(signed) / len(signed), sum(absolute) / len(absolute)


def reduce_mean(values, device):
    """The mean over ranks of a few numbers (a list of floats or a tensor), with one all_reduce."""
    t = torch.as_tensor(values, dtype=torch.float64, device=device).clone()
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t.tolist()


@torch.no_grad()
def evaluate(model, val_data, c, device, autocast):
    """Mean validation loss per token over eval_batches batches of micro_batch_size windows, split over ranks."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    for b in range(rank, c['eval_batches'], world):
        first = b * c['micro_batch_size']
        indices = [i % len(val_data) for i in range(first, first + c['micro_batch_size'])]
        x, y = (torch.from_numpy(t).to(device) for t in val_data.get(indices))
        with autocast:
            _, loss = model(x, y)
        total += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64, device=device)
    model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def attention_stats(model, alpha_means):
    """Per-layer head means of this step's E[alpha] and of alpha_ma (affine), or of the sink logits (sink)."""
    layers = [layer.self_attn for layer in model.model.layers]
    stats = {}
    if alpha_means:
        stats['alpha_mean'] = [round(a.mean().item(), 5) for a in alpha_means]
    if hasattr(layers[0], 'alpha_ma'):
        stats['alpha_ma'] = [round(m.alpha_ma.mean().item(), 5) for m in layers]
    if hasattr(layers[0], 'sinks'):
        stats['sinks'] = [round(m.sinks.mean().item(), 5) for m in layers]
    return stats


class DeviceTimer:
    """Time spent in code blocks on the device, without synchronising: CUDA events (read after the step's
    own synchronisation), wall clock on CPU."""

    def __init__(self, device):
        self.cuda, self.spans = device.type == 'cuda', []

    @contextmanager
    def __call__(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.spans.append(time.perf_counter() - t0)

    def seconds(self):
        """The total since the last call (after a synchronisation, on CUDA)."""
        total = sum(s.elapsed_time(e) / 1000 for s, e in self.spans) if self.cuda else sum(self.spans)
        self.spans = []
        return total


@contextmanager
def preemption_flag():
    """While active, SIGTERM / SIGINT only append to the yielded list: the loop finishes its step, saves a
    checkpoint and exits cleanly (cluster preemption, Ctrl-C)."""
    flag = []
    previous = {sig: signal.signal(sig, lambda signum, frame: flag.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -----------------------------------------------------------------------------------------------

def main(argv):
    c = load_config(argv)
    try:
        model_config = ModelConfig(**{k: c[k] for k in FIELD_NAMES})
    except ValueError as e:  # ModelConfig's own checks (variant names, head counts, rope_scaling)
        raise SystemExit(f"config: {e}")
    if c['dry_run']:
        with torch.device('meta'):
            model = GPT(model_config)
            softmax = GPT(dataclasses.replace(model_config, attention='softmax'))
        total = model.get_num_params()
        embedding = model.model.embed_tokens.weight.numel()
        if not model_config.tie_embeddings:
            embedding += model.lm_head.weight.numel()
        print(f"params: total={total} non_embedding={total - embedding} "
              f"attention_extra={total - softmax.get_num_params()}")
        return

    # --- distributed setup (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK) ---
    ddp = 'RANK' in os.environ
    rank, world = (int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])) if ddp else (0, 1)
    if c['device'] == 'auto':
        c['device'] = 'cuda' if torch.cuda.is_available() else 'cpu'
    device = torch.device(c['device'])
    if ddp and device.type == 'cuda':
        device = torch.device('cuda', int(os.environ['LOCAL_RANK']))
        torch.cuda.set_device(device)
    if ddp:
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo')
    master = rank == 0
    if c['dtype'] == 'auto':
        c['dtype'] = 'bfloat16' if device.type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if c['dtype'] == 'bfloat16' else nullcontext()
    if c['compile'] is None:
        c['compile'] = device.type == 'cuda'
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])  # micro-steps per rank
    if rest or accumulation == 0:
        raise SystemExit(f"global_batch_size={c['global_batch_size']} must be a multiple of world size ({world}) "
                         f"x micro_batch_size ({c['micro_batch_size']})")

    # --- data, checked against the model before step 0 ---
    data_meta = read_meta(c['data_dir'])
    if data_meta['vocab_size'] > model_config.vocab_size:
        raise SystemExit(f"data_dir={c['data_dir']} was tokenized with {data_meta['vocab_size']} token ids but the "
                         f"model has vocab_size={model_config.vocab_size}")
    train_data = Windows(c['data_dir'], 'train', model_config.block_size)
    val_data = Windows(c['data_dir'], 'val', model_config.block_size)

    # --- model, optimizer, resume ---
    os.makedirs(c['out_dir'], exist_ok=True)
    ckpt_path = os.path.join(c['out_dir'], 'ckpt.pt')
    torch.manual_seed(c['seed'])
    model = GPT(model_config).to(device)
    optimizer = model.configure_optimizers(c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']))
    start_step = 0
    if c['init_from'] == 'resume':
        if not os.path.isfile(ckpt_path):
            raise SystemExit(f"init_from=resume: no checkpoint at {ckpt_path}")
        ckpt = torch.load(ckpt_path, map_location='cpu', weights_only=False)  # CPU first: no GPU memory spike
        if ckpt['model_config'] != dataclasses.asdict(model_config):
            changed = [k for k in FIELD_NAMES if ckpt['model_config'].get(k) != getattr(model_config, k)]
            raise SystemExit(f"{ckpt_path} holds a different model ({', '.join(changed)} differ)")
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])  # moves the state to the parameters' device
        start_step = ckpt['step']
        set_rng_state(ckpt['rng'])
        del ckpt
    raw_model = model
    if c['compile']:
        model = torch.compile(model)
    if ddp:
        # alpha_ma's per-rank sums must not be overwritten by rank 0's buffers (see GPT.update_alpha_ma)
        model = DDP(model, device_ids=[device.index] if device.type == 'cuda' else None, broadcast_buffers=False)

    teacher = None
    if c['teacher']:
        from distill import check_compatibility, fused_kd_loss, load_teacher
        raw_teacher = load_teacher(c['teacher'], device, torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32)
        check_compatibility(raw_teacher, c['teacher'], model_config, data_meta, model_config.block_size)
        teacher = torch.compile(raw_teacher) if c['compile'] else raw_teacher

    peak_flops = c['peak_flops'] or default_peak_flops(device, torch.bfloat16 if c['dtype'] == 'bfloat16'
                                                       else torch.float32)
    if master:
        with open(os.path.join(c['out_dir'], 'config.json'), 'w') as f:
            json.dump(c, f, indent=1)
        print(f"GPT: {raw_model.get_num_params():,} parameters, attention={model_config.attention}; {world} rank(s) x "
              f"{accumulation} micro-steps x {c['micro_batch_size']} sequences x {model_config.block_size} tokens; "
              f"{device}, {c['dtype']}; {len(train_data):,} train windows")
        if c['wandb_log']:
            import wandb
            wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)
    if master:  # on resume keep the records up to the checkpoint's step (a crash may have left later ones)
        metrics_path = os.path.join(c['out_dir'], 'metrics.jsonl')
        kept = []
        if start_step and os.path.isfile(metrics_path):
            kept = [line for line in open(metrics_path) if json.loads(line)['step'] <= start_step]
        with open(metrics_path, 'w') as f:
            f.writelines(kept)

    # --- the loop ---
    skipped, alpha_means = 0, []
    teacher_timer = DeviceTimer(device)  # the teacher's forward time, logged apart from the student's
    batch = c['micro_batch_size']
    tokens_per_step = c['global_batch_size'] * model_config.block_size
    model.train()
    step = start_step
    with preemption_flag() as stop_signal:
        while step < c['max_iters']:
            t0 = time.perf_counter()
            lr = learning_rate(step, c)
            for group in optimizer.param_groups:
                group['lr'] = lr
            # this rank's part of the global batch, then its micro-batches
            mine = train_data.step_indices(c['seed'], step, c['global_batch_size'])[rank * accumulation * batch:]
            sums = torch.zeros(3, device=device)  # loss, KD, CE over micro-steps: read once per step (no syncs)
            for micro in range(accumulation):
                x, y = (torch.from_numpy(t).to(device) for t in train_data.get(mine[micro * batch:(micro + 1) * batch]))
                # DDP: gradients are all-reduced only in the backward of the last micro-step
                with model.no_sync() if ddp and micro < accumulation - 1 else nullcontext():
                    with autocast:
                        if teacher is None:
                            _, loss = model(x, y)
                            sums[0] += loss.detach()
                        else:
                            with teacher_timer(), torch.no_grad():
                                teacher_hidden, _ = teacher(x, return_hidden=True)
                            hidden, _ = model(x, return_hidden=True)
                            loss, kd, ce = fused_kd_loss(hidden, raw_model.lm_head.weight, teacher_hidden,
                                                         raw_teacher.lm_head.weight, temperature=c['kd_temperature'],
                                                         targets=y, kd_alpha=c['kd_alpha'])
                            sums += torch.stack([loss.detach(), kd, ce])
                    (loss / accumulation).backward()
            # the raw norm before clipping (paper Tables 4-5); grad_clip=0 only measures it
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c['grad_clip'] or math.inf).item()
            loss_mean, kd_mean, ce_mean = reduce_mean(sums / accumulation, device)
            if math.isfinite(loss_mean) and math.isfinite(grad_norm):
                optimizer.step()
                alpha_means = raw_model.update_alpha_ma()  # Eq. 9 with this step's global batch
            elif c['nonfinite'] == 'stop':
                raise SystemExit(f"step {step}: non-finite loss ({loss_mean}) or gradient norm ({grad_norm}); "
                                 f"stopping (nonfinite='skip' skips such steps instead)")
            else:
                skipped += 1
                alpha_means = raw_model.update_alpha_ma(discard=True)
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            step += 1

            record = dict(step=step, lr=lr, loss=loss_mean, grad_norm=grad_norm, tokens_per_sec=tokens_per_step / dt,
                          mfu=raw_model.estimate_mfu(c['global_batch_size'] / world, dt, peak_flops), dt=dt)
            if teacher is not None:
                record.update(kd_loss=kd_mean, ce_loss=ce_mean, teacher_sec=teacher_timer.seconds())
            if c['nonfinite'] == 'skip':
                record['skipped_steps'] = skipped
            if step % c['eval_interval'] == 0 or step == c['max_iters']:
                record['val_loss'] = evaluate(model, val_data, c, device, autocast)
                record['val_ppl'] = math.exp(min(record['val_loss'], 50))
                with autocast:
                    record['attn_logit_mean'], record['attn_logit_abs_mean'] = mean_attention_logit(
                        raw_model, torch.from_numpy(val_data.get([0])[0]).to(device))
                record.update(attention_stats(raw_model, alpha_means))
            if master:
                with open(metrics_path, 'a') as f:
                    f.write(json.dumps(record) + '\n')
                if c['wandb_log']:
                    wandb.log(record, step=step)
                if step % c['log_interval'] == 0 or 'val_loss' in record:
                    val = f" | val {record['val_loss']:.4f}" if 'val_loss' in record else ''
                    print(f"step {step}/{c['max_iters']} | loss {loss_mean:.4f}{val} | lr {lr:.2e} | "
                          f"grad {grad_norm:.3f} | {record['tokens_per_sec']:,.0f} tok/s | "
                          f"mfu {100 * record['mfu']:.2f}% | {1000 * dt:.0f} ms", flush=True)
            stop = reduce_mean([float(bool(stop_signal))], device)[0] > 0  # all ranks stop at the same step
            if 'val_loss' in record or stop:
                if master:
                    save_checkpoint(ckpt_path, dict(
                        model=raw_model.state_dict(), optimizer=optimizer.state_dict(), step=step, rng=rng_state(),
                        config=c, model_config=dataclasses.asdict(model_config), tokenizer=data_meta['tokenizer']))
                if ddp:
                    dist.barrier()
            if stop:
                if master:
                    print(f"stopped by a signal: saved {ckpt_path} at step {step}; continue with --init_from=resume",
                          flush=True)
                break
    if ddp:
        dist.destroy_process_group()

if __name__ == '__main__':
    main(sys.argv[1:])
