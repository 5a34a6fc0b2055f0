"""
Train a student with the paper's recipe (Section 5.1, Appendix B.1), on one CPU or many GPUs.

    python train.py config/tiny_cpu.py --data_dir=data/builtin_bytes --max_iters=200      # a laptop CPU
    torchrun --standalone --nproc_per_node=8 train.py config/affine_1b.py                # one 8-GPU node (DDP)
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 --rdzv_id=JOB \
        train.py config/affine_3b.py                                                      # 16 GPUs, FSDP (fsdp=True)
    python train.py config/affine_3b.py --dry_run=True                      # parameter counts, per-GPU memory plan

Configuration, nanoGPT-style (configurator.py): the defaults below, then each config file (plain assignments), then
--key=value overrides (strings as written, other keys Python literals: 3e-4, None, True, {'a': 1}). Unknown keys and
wrong types are errors. `model = 'llama3.2-1b'` (model.MODEL_SHAPES) sets a published shape where it stands; lines
and overrides after it still win. The resolved config is written to out_dir/config.json.

Data: step s trains on windows perm[s*G : (s+1)*G] of the train split (data.Windows), G the global
batch, perm a permutation seeded by (seed, epoch): every window once per epoch (the paper trains one epoch),
and a step's data depends only on (seed, step), never on the number of ranks or the micro-batch size. The
position to resume from is therefore just the step.

Scale: DDP keeps a full fp32 student and its AdamW state on every GPU (16 bytes a parameter); fsdp=True shards
them over the ranks with PyTorch's FSDP2 (fully_shard per decoder layer), activation_checkpointing=True trades
a recomputed forward for most activation memory. Checkpoints hold full (unsharded) state keyed by parameter
name either way, so a run resumes on any number of ranks, with or without FSDP. memory_plan.py is the plan.

Reading order: train, at the bottom, is the training loop, as nanoGPT writes it: each micro-step's forward, loss
(compute_loss) and backward, then clipping and AdamW (take_step), alpha_ma (Eq. 9), logging, evaluation and
checkpoints; main, below it, checks everything it can before writing, then holds out_dir for the run (one writer:
files.lock_dir). Above them, the setup they call (setup_run, load_data, build_model, load_run_teacher), and above
that the pieces of a step; what runs the model over the ranks (DDP, FSDP2, compile) is in common.py, the checks of
the settings against the data and of the weights before a save in run_checks.py, the records in run_log.py.
"""
import dataclasses
import math
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

from checkpoint import CKPT_NAME, is_run_config, model_state, read_checkpoint, save_checkpoint
from common import (DeviceTimer, apply_fsdp, batch_to_device, check_cpu_compiler, compile_layers, default_peak_flops,
                    estimate_mfu, full_tensor, gemm_shapes, init_distributed, init_matched, preemption_flag,
                    reduce_mean, resolve_device, resolve_dtype, wrap_ddp)
from configurator import DEVICE, Key, parse
from data import Windows, first_token_id, read_meta
from files import RunError, claim_dir, lock_dir, run_script
from distill import check_compatibility, fused_kd_loss, kd_loss, load_teacher
from memory_plan import print_dry_run
from model import AFFINE_ACTS, AFFINE_BIAS_NORMS, ATTENTIONS, FIELD_NAMES, GPT, MODEL_SHAPES, ModelConfig
from probes import mean_attention_logit, sink_record, variant_tensor_means
from resume import (changed_settings, check_resumable, checkpoint_to_resume, data_fingerprint, lr_changes,
                    recorded_config, rng_state, set_rng_state)
from run_checks import check_finite, check_sizes, start_notes, validation_batches
from run_log import Metrics, import_wandb

SAVE_TIMEOUT = timedelta(hours=2)  # how long ranks wait for rank 0 to write a checkpoint (NCCL's default is 10 min)

# -----------------------------------------------------------------------------------------------
# The keys, with the paper's recipe as their defaults; the model's keys are ModelConfig's fields (model.py), usually
# set by a config file's `model = '<shape>'`. `python train.py --help` lists them all.
# A key added later takes the default that does what the code did before it: a checkpoint written before the key
# resumes with that default (recorded_config).
TRAIN_KEYS = dict(
    out_dir=Key('out', "where ckpt.pt, metrics.jsonl and config.json go"),
    data_dir=Key('data/fineweb_edu_llama3', "a prepare_data.py output directory"),
    first_token=Key('stream', "position 0 of every training and validation window. stream: the token where the "
                    "window's cut lands (nanoGPT's windows); prefix: the tokenizer's BOS (else its end-of-text token), "
                    "then block_size - 1 tokens of the stream: a fixed first token, under which attention sinks "
                    "grow (Gu et al. 2025; study/sink_study.py, docs/data.md)", choices=('stream', 'prefix')),
    init_from=Key('auto', "auto: continue from out_dir/ckpt.pt if there is one (bit-exactly), else start fresh; "
                  "resume: continue, and refuse if there is none; scratch: start fresh, and refuse to replace a "
                  "checkpoint unless overwrite", choices=('auto', 'resume', 'scratch')),
    overwrite=Key(False, "with init_from=scratch: start over even though out_dir holds a checkpoint (replaced)"),
    keep_previous=Key(True, "at each save, keep the checkpoint it replaces as ckpt.prev.pt (a hard link, no copy): "
                      "the one to fall back to if ckpt.pt is ever damaged"),
    max_iters=Key(9000, "optimizer steps (Appendix B.1)", min=1),
    global_batch_size=Key(1024, "sequences per optimizer step, over all ranks (Section 5.1)", min=1),
    micro_batch_size=Key(8, "sequences per forward on one rank; accumulation steps are derived", min=1),
    learning_rate=Key(1e-3, "Section 5.1 (swept 5e-4 ... 5e-3); at most 1: AdamW moves each weight by about the "
                      "learning rate a step, and the weights start at init_std=0.02, so 1 already replaces them all in "
                      "one step (200x the largest rate the paper swept)", above=0, max=1),
    min_lr=Key(0.0, "learning rate at the end of the decay (at most learning_rate)", min=0),
    resume_lr_change=Key(False, "on resume: let learning_rate and min_lr differ from the checkpoint's (e.g. lower "
                         "after a non-finite stop); the change is recorded in metrics.jsonl"),
    warmup_iters=Key(100, "linear warmup of the warmup-stable-decay schedule (Appendix B.1)", min=0),
    decay_frac=Key(0.2, "the last 20% of the steps decay linearly to min_lr (the paper gives no number)", min=0, max=1),
    weight_decay=Key(0.1, "AdamW, on matrices only (Section 5.1)", min=0),
    matched_init=Key(False, "initialise each module from (seed, its name) alone (common.init_matched): variants of "
                     "one seed then share every initial tensor they have in common; False: one stream in module order"),
    no_decay=Key([], "modules whose matrices do not decay (the sink study's control: alpha_proj,g_proj)",
                 choices=('alpha_proj', 'g_proj', 'q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj',
                          'down_proj', 'embed_tokens', 'lm_head')),
    beta1=Key(0.9, "AdamW", min=0, below=1),
    beta2=Key(0.95, "AdamW", min=0, below=1),
    grad_clip=Key(1.0, "clip the global gradient norm (0: off); metrics log the norm before clipping", min=0),
    seed=Key(1337, "the initial weights and the order of the data; at most 2**64 - 1, the largest seed "
             "torch.manual_seed takes", min=0, max=2 ** 64 - 1),
    eval_interval=Key(500, "evaluate, log attention statistics and save a checkpoint every this many steps", min=1),
    eval_batches=Key(20, "validation batches of micro_batch_size sequences, split over ranks", min=1),
    attention_windows=Key(0, "validation windows each evaluation measures the sink on: first-token weight, share "
                          "and null mass per layer and head, Gu et al.'s Sink_1^0.3, alpha's spread, value-weighted "
                          "share, outliers, entropy, row sums (probes.sink_record; a T x T matrix per layer and head, "
                          "so 0, off, for large models)", min=0),
    log_interval=Key(10, "console line every this many steps (metrics.jsonl gets every step)", min=1),
    nonfinite=Key('stop', "a non-finite loss or gradient norm: stop with an error, or skip the step and count it",
                  choices=('stop', 'skip')),
    max_skipped_frac=Key(0.05, "nonfinite='skip': stop with an error, saving nothing more, once more than this share "
                         "of max_iters has been skipped (1: never)", min=0, max=1),
    device=DEVICE,
    dtype=Key('auto', "auto: bfloat16 autocast on GPUs that support it, else float32",
              choices=('auto', 'float32', 'bfloat16')),
    compile=Key(None, "torch.compile per decoder layer; None: on for CUDA, off for CPU", types=(bool,)),
    peak_flops=Key(None, "per-device peak FLOP/s for MFU; None: a table for known GPUs, else a measured matmul peak",
                   types=(float, int), above=0),
    teacher=Key(None, "knowledge distillation from a teacher: a Hugging Face directory or one of our checkpoints",
                types=(str,)),
    kd_temperature=Key(1.0, "T of the KD loss; at most 100: distillation uses 1 to 20, and at 100 logits 10 apart "
                       "differ by 0.1, the teacher's distribution all but uniform", above=0, max=100),
    kd_alpha=Key(1.0, "loss = kd_alpha * KD + (1 - kd_alpha) * CE; 1.0 is the paper's pure KD", min=0, max=1),
    kd_loss=Key('fused', "fused: distill.fused_kd_loss, chunked, never holding the (tokens x vocab) logits; plain: "
                "distill.kd_loss, the same loss from full logits with autograd (readable, memory-hungry)",
                choices=('fused', 'plain')),
    wandb_log=Key(False, "also log to Weights & Biases"),
    wandb_project=Key('affine-scaled-attention'),
    wandb_run_name=Key(None, types=(str,)),
    # FSDP2: shard the student's weights, gradients and AdamW state over the ranks (fully_shard, one group per
    # decoder layer); with bfloat16, layers are gathered and computed in bf16 from fp32 shards and gradients are
    # reduce-scattered in fp32. The teacher stays whole on every rank (inference only).
    fsdp=Key(False, "shard the student over the ranks with FSDP2 (needs torchrun)"),
    activation_checkpointing=Key(False, "keep only each decoder layer's input, recompute the layer in backward"),
    dry_run=Key(False, "build the model on the meta device, print parameter counts and the memory plan, exit"),
    dry_run_world_size=Key(8, "GPUs the dry run's per-GPU memory plan assumes (a real run: torchrun's ranks)", min=1),
    dry_run_gpu_gib=Key(80.0, "memory of one GPU, for the dry run's verdict on whether the config fits", above=0),
)
# what must hold between the keys, checked with them (warmup_iters may exceed max_iters: a short test of a config;
# run_checks.start_notes warns)
RULES = ('min_lr <= learning_rate',)
DEFAULTS = {name: key.default for name, key in TRAIN_KEYS.items()}
# what each ModelConfig field's key declares besides its default (ModelConfig checks how the head counts divide n_embd)
MODEL_FIELD_KEYS = dict(
    n_layer=dict(min=1), n_head=dict(min=1), n_kv_head=dict(min=1), n_embd=dict(min=1), intermediate_size=dict(min=1),
    vocab_size=dict(min=1), block_size=dict(min=1),
    rope_theta=dict(above=1, max=1e9, help="RoPE's base; above 1 (at 1 every pair of dimensions turns at one speed, "
                    "and below it the slowest come first), at most 1e9: published models use 1e4 to 1e6 (model."
                    "MODEL_SHAPES), and at 1e9 the slowest pair turns once in 6e9 tokens"),
    rope_scaling=dict(types=(dict,)),
    rms_norm_eps=dict(above=0, max=1e-3, help="at most 1e-3: published models use 1e-6 to 1e-5, and the embeddings "
                      "start with a mean square of init_std**2 = 4e-4, which a larger eps would outweigh (the norm "
                      "would no longer normalise)"),
    init_std=dict(above=0), attention=dict(choices=ATTENTIONS),
    affine_act=dict(choices=AFFINE_ACTS), affine_momentum=dict(min=0, max=1),
    affine_bias_norm=dict(choices=AFFINE_BIAS_NORMS))
KEYS = {**TRAIN_KEYS,
        **{f.name: Key(f.default, **{'help': "ModelConfig (model.py)", **MODEL_FIELD_KEYS.get(f.name, {})})
           for f in dataclasses.fields(ModelConfig)},
        # a published shape by name: model = 'llama3.2-1b' sets its ModelConfig fields where it stands, so the
        # lines and overrides after it still win
        'model': Key(None, "a published shape (model.MODEL_SHAPES): sets its ModelConfig fields where it stands",
                     choices=tuple(MODEL_SHAPES), types=(str,), expands=MODEL_SHAPES)}
KEY_DEFAULTS = {name: key.default for name, key in KEYS.items()}  # what a key a checkpoint predates takes


def load_config(argv):
    """Defaults <- config files <- --key=value overrides, each key checked (configurator.py)."""
    return parse(argv, KEYS, __doc__, files=True, prog='train.py', rules=RULES)


# -----------------------------------------------------------------------------------------------
# Schedule, optimizer, checkpoints

def learning_rate(step, c):
    """Warmup-stable-decay: linear warmup, constant, then linear decay to min_lr over the last decay_frac."""
    if step < c['warmup_iters']:
        return c['learning_rate'] * (step + 1) / c['warmup_iters']
    decay_start = int(c['max_iters'] * (1 - c['decay_frac']))
    if step < decay_start:
        return c['learning_rate']
    progress = (step - decay_start) / max(1, c['max_iters'] - decay_start)
    return c['learning_rate'] + (c['min_lr'] - c['learning_rate']) * progress


def configure_optimizers(model, weight_decay, lr, betas, fused=None, no_decay=()):
    """AdamW; matrices (embeddings and projections) decay, vectors (norms, biases, sinks) do not, nor do the matrices
    of the modules named in no_decay (the sink study's control: alpha_proj, g_proj)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decays = [p.dim() >= 2 and not set(no_decay) & set(n.split('.')) for n, p in named]
    groups = [{'params': [p for (_, p), d in zip(named, decays) if d], 'weight_decay': weight_decay},
              {'params': [p for (_, p), d in zip(named, decays) if not d], 'weight_decay': 0.0}]
    params = [p for _, p in named]
    if fused is None:
        fused = all(p.device.type == 'cuda' for p in params)
    # elsewhere the multi-tensor implementation (torch's default only on CUDA): the same numbers bit for bit, in a
    # tenth of the ops, which on a small CPU model took a tenth of the step
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused, foreach=not fused)


def planned_run(argv, cwd=''):
    """(config, step, changed) of the train.py command `argv` (a config file, then overrides; run in cwd) beside the
    checkpoint its out_dir holds: the config train.py would resolve, the step the checkpoint reached (None: none),
    and changed_settings' changes as 'key old -> new', max_iters among them (the plans train a changed run again
    from scratch: resume.RESTART)."""
    c = load_config(argv)
    c['dtype'] = resolve_dtype(c['dtype'], resolve_device(c['device']))  # as setup_run resolves it
    path = os.path.join(cwd, c['out_dir'], CKPT_NAME)
    if not os.path.exists(path):
        return c, None, []
    then = read_checkpoint(path, keys=('step', 'config'))
    changed = changed_settings(recorded_config(then['config'], KEY_DEFAULTS)[0], c, also=('max_iters',))
    return c, then['step'], [f"{key} {before!r} -> {after!r}" for key, before, after in changed]


# -----------------------------------------------------------------------------------------------
# What a step computes and what an evaluation measures

def compute_loss(model, student, teacher, x, y, c, teacher_timer=None):
    """(loss, KD, CE) of one micro-batch (x, y): loss to backpropagate, KD and CE detached for logging (zeros without a
    teacher). model: the module to call (compiled / DDP / FSDP); student: the GPT itself (its lm_head for the KD
    loss); teacher: None (cross-entropy) or a GPT in eval mode, its forward timed by teacher_timer (a DeviceTimer)."""
    if teacher is None:
        _, loss = model(x, y)
        zero = loss.detach().new_zeros(())
        return loss, zero, zero
    with teacher_timer() if teacher_timer else nullcontext(), torch.no_grad():
        teacher_hidden, _ = teacher(x, return_hidden=True)
    hidden, _ = model(x, return_hidden=True)
    return (fused_kd_loss if c['kd_loss'] == 'fused' else kd_loss)(
        hidden, student.lm_head.weight, teacher_hidden, teacher.lm_head.weight, temperature=c['kd_temperature'],
        targets=y, kd_alpha=c['kd_alpha'])


EVAL_STOP_EVERY = 4  # validation batches between looks at the stop signal (a look is a host sync, and collective)


@torch.no_grad()
def validation_loss(model, val_data, c, device, autocast, stop=()):
    """Mean validation loss per token over validation_batches(c, val_data) batches of micro_batch_size windows, split
    over ranks. Every rank runs equally many forwards (FSDP's all-gathers are collective); the padding ones are not
    counted. None where `stop` (preemption_flag's list) fills meanwhile: a signal ends the evaluation within
    EVAL_STOP_EVERY batches, every rank at the same batch, and no partial loss is returned."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    batches = validation_batches(c, val_data)
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    model.eval()
    try:
        for n, b in enumerate(range(rank, math.ceil(batches / world) * world, world)):
            if n % EVAL_STOP_EVERY == 0 and reduce_mean([float(bool(stop))], device)[0] > 0:
                return None
            first = b * c['micro_batch_size']
            indices = [i % len(val_data) for i in range(first, first + c['micro_batch_size'])]
            x, y = batch_to_device(val_data.get(indices), device)
            with autocast:
                _, loss = model(x, y)
            if b < batches:  # summed on the device: no host sync per batch, so the copies overlap the forwards
                total[0] += loss.double() * y.numel()
                total[1] += y.numel()
    finally:
        model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def evaluation_record(c, run, model, raw_model, val_data, alpha_means, stop=()):
    """The evaluation record: validation loss and perplexity, the mean attention logit (Figure 2), the variant's
    statistics (alpha, alpha_ma, sinks) and, with attention_windows, the sink's measures (sink_record). Every rank
    takes part. Empty where a signal (stop: preemption_flag's list) cut the validation loss short."""
    val_loss = validation_loss(model, val_data, c, run.device, run.autocast, stop)
    if val_loss is None:
        return {}
    record = dict(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50)))
    with run.autocast:
        record['attn_logit_mean'], record['attn_logit_abs_mean'] = mean_attention_logit(
            raw_model, batch_to_device(val_data.get([0]), run.device)[0])
        if c['attention_windows']:  # the same windows at every evaluation
            record |= sink_record(raw_model, batch_to_device(val_data.get(range(c['attention_windows'])),
                                                             run.device)[0])
    return record | variant_tensor_means(raw_model, alpha_means)


# -----------------------------------------------------------------------------------------------
# The run: setup, logging, checkpoints, the loop

@dataclasses.dataclass
class Run:
    """Where this process trains: its rank among `world`, its device, and what follows from them."""
    rank: int
    world: int
    device: torch.device
    distributed: bool  # under torchrun: DDP, or FSDP with fsdp=True
    ddp: bool
    accumulation: int  # micro-steps per optimizer step on this rank
    autocast: object  # the forward's context: bf16 autocast or nothing
    save_group: object = None  # a gloo group with a long timeout for the barrier after a save (SAVE_TIMEOUT)

    @property
    def master(self):
        return self.rank == 0


def setup_run(c):
    """Ranks (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK), the device, and the config's 'auto' values resolved."""
    distributed = 'RANK' in os.environ
    if c['fsdp'] and not distributed:
        raise RunError("fsdp=True shards the model over the ranks torchrun starts: launch with torchrun "
                       "--nproc_per_node=N train.py ... (N=1 works), or drop --fsdp=True for one process")
    rank, world = (int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])) if distributed else (0, 1)
    device = resolve_device(c['device'])
    c['device'] = str(device)
    if distributed and device.type == 'cuda':
        device = torch.device('cuda', int(os.environ['LOCAL_RANK']))
        torch.cuda.set_device(device)
    save_group = None
    if distributed:
        init_distributed('nccl' if device.type == 'cuda' else 'gloo')
        # rank 0 may write a checkpoint of tens of GB to slow storage while the others wait: they wait in a gloo
        # barrier with a long timeout, with no NCCL collective pending that the watchdog would time out
        save_group = dist.new_group(backend='gloo', timeout=SAVE_TIMEOUT)
    c['dtype'] = resolve_dtype(c['dtype'], device)
    if c['compile'] is None:
        c['compile'] = device.type == 'cuda'
    if c['compile'] and device.type == 'cpu':
        check_cpu_compiler()
    accumulation, rest = divmod(c['global_batch_size'], world * c['micro_batch_size'])
    if rest or accumulation == 0:
        raise RunError(f"global_batch_size={c['global_batch_size']} must be a multiple of world size ({world}) "
                       f"x micro_batch_size ({c['micro_batch_size']})")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if c['dtype'] == 'bfloat16' else nullcontext()
    return Run(rank, world, device, distributed, distributed and not c['fsdp'], accumulation, autocast, save_group)


def load_data(c, model_config):
    """(meta.json, train windows, val windows) of data_dir, checked against the model before step 0."""
    meta = read_meta(c['data_dir'])
    if meta['vocab_size'] > model_config.vocab_size:
        raise RunError(f"data_dir={c['data_dir']} was tokenized with {meta['vocab_size']} token ids but the "
                       f"model has vocab_size={model_config.vocab_size}")
    first = first_token_id(c, meta['tokenizer'])
    return (meta, Windows(c['data_dir'], 'train', model_config.block_size, first),
            Windows(c['data_dir'], 'val', model_config.block_size, first))


def build_model(c, model_config, run, data_meta, ckpt_path):
    """(the GPT, its AdamW, where the loop starts): fresh from the seed, or out_dir's checkpoint continued bit-exactly;
    compiled per layer and sharded (FSDP) as the config asks. Where the loop starts: its step, the steps skipped so far
    (nonfinite='skip') and the first of them, and the learning-rate keys this resume changes (lr_changes)."""
    torch.manual_seed(c['seed'])
    model = GPT(model_config)
    if c['matched_init']:
        init_matched(model, c['seed'])
    model = model.to(run.device)  # whole on every rank first: FSDP then starts from DDP's initial weights
    for layer in model.model.layers:
        layer.activation_checkpointing = c['activation_checkpointing']
    ckpt, changes, predated = checkpoint_to_resume(c, ckpt_path), {}, {}
    if ckpt is not None:
        changes = lr_changes(ckpt, c)  # asked for: not a difference to refuse
        predated = check_resumable(ckpt, {**c, **{key: change['from'] for key, change in changes.items()}},
                                   model_config, data_meta, ckpt_path, KEY_DEFAULTS)
        model.load_state_dict(model_state(ckpt))  # full tensors, before any sharding
    if run.master:  # the first line of every run says how it started
        print(f"init_from={c['init_from']}: " + (f"resuming from {ckpt_path} at step {ckpt['step']}" if ckpt is not None
              else f"starting fresh{' (replacing ' + ckpt_path + ')' if os.path.isfile(ckpt_path) else ''}")
              + ''.join(f"; {key} {change['from']} -> {change['to']} (resume_lr_change=True)"
                        for key, change in changes.items()), flush=True)
        if predated:
            print(f"note: {ckpt_path} predates the key{'s' * (len(predated) > 1)} {', '.join(predated)}; "
                  f"{'they take their defaults' if len(predated) > 1 else 'it takes its default'} "
                  f"{', '.join(f'{key}={value!r}' for key, value in predated.items())}", file=sys.stderr, flush=True)
    if c['compile']:
        compile_layers(model)
    if c['fsdp']:
        apply_fsdp(model, c['dtype'])
    optimizer = configure_optimizers(model, c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']),
                                     no_decay=c['no_decay'])
    if ckpt is None:
        return model, optimizer, dict(step=0, skipped=0, first_skipped=None, lr_changes={})
    # the full state, keyed by parameter name; under FSDP each rank keeps its shard
    set_optimizer_state_dict(model, optimizer, ckpt['optimizer'], options=StateDictOptions(full_state_dict=True))
    set_rng_state(ckpt['rng'])
    skipped = ckpt.get('skipped', {})  # a checkpoint from before it was saved counted none
    return model, optimizer, dict(step=ckpt['step'], skipped=skipped.get('steps', 0),
                                  first_skipped=skipped.get('first'), lr_changes=changes)


def load_run_teacher(c, model_config, data_meta, device):
    """The KD teacher in the run's dtype, checked against the data and the student before step 0; None without one."""
    if not c['teacher']:
        return None
    teacher = load_teacher(c['teacher'], device, torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32)
    check_compatibility(teacher, c['teacher'], model_config, data_meta, model_config.block_size)
    if c['compile']:
        compile_layers(teacher)
    return teacher


def save(path, step, skipped, c, run, raw_model, optimizer, model_config, data_meta):
    """ckpt.pt at `step`: full tensors on rank 0's CPU, keyed by name (every rank takes part in gathering FSDP's
    shards); the other ranks wait in the save group's barrier while rank 0 writes. skipped: {'steps': how many
    nonfinite='skip' skipped so far, 'first': the first one's step}, which the run continues counting."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state_dict = get_model_state_dict(raw_model, options=options)
    optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=options)
    if run.master:
        save_checkpoint(path, dict(model=model_state_dict, optimizer=optimizer_state, step=step, rng=rng_state(),
                                   config=c, model_config=dataclasses.asdict(model_config),
                                   tokenizer=data_meta['tokenizer'], data=data_fingerprint(data_meta),
                                   skipped=skipped),
                        keep_previous=c['keep_previous'])
    del model_state_dict, optimizer_state
    if run.distributed:
        dist.barrier(group=run.save_group)


def take_step(c, run, model, raw_model, teacher, optimizer, train_data, step, teacher_timer):
    """The optimizer step after `step` steps: each micro-step's forward, loss and backward over this rank's part of
    the step's global batch, the gradient clipped, and AdamW's update where the loss and the gradient norm are
    finite (else nonfinite='stop' stops here, 'skip' leaves the weights as they were). Returns (lr, loss, KD, CE,
    gradient norm, finite); the gradients are still to be zeroed."""
    B, lr = c['micro_batch_size'], learning_rate(step, c)
    for group in optimizer.param_groups:
        group['lr'] = lr
    # this rank's part of the step's global batch (a function of (seed, step) only), as micro-batches
    mine = train_data.step_indices(c['seed'], step, c['global_batch_size'])[run.rank * run.accumulation * B:]
    losses = torch.zeros(3, device=run.device)  # (loss, KD, CE) summed on the device: read once per step
    for micro in range(run.accumulation):
        x, y = batch_to_device(train_data.get(mine[micro * B:(micro + 1) * B]), run.device)
        # DDP all-reduces the gradients only in the last micro-step's backward; FSDP reduce-scatters them
        # every micro-step (only the sharded gradients are kept between micro-steps)
        with model.no_sync() if run.ddp and micro < run.accumulation - 1 else nullcontext():
            with run.autocast:
                loss, kd, ce = compute_loss(model, raw_model, teacher, x, y, c, teacher_timer)
            (loss / run.accumulation).backward()
        losses += torch.stack([loss.detach(), kd, ce])
    # the raw norm before clipping (paper Tables 4-5); grad_clip=0 only measures it
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c['grad_clip'] or math.inf)).item()
    loss, kd, ce = reduce_mean(losses / run.accumulation, run.device)
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    elif c['nonfinite'] == 'stop':
        raise RunError(f"step {step + 1}: non-finite loss ({loss}) or gradient norm ({grad_norm}); stopping. "
                       f"To continue from the last checkpoint with a lower learning rate: "
                       f"--learning_rate=<lower> --resume_lr_change=True (nonfinite='skip' skips such steps "
                       f"instead)")
    return lr, loss, kd, ce, grad_norm, finite


def train(c, model_config, run, data_meta, train_data, val_data, wandb):
    """The run, in out_dir, which this process (rank 0) holds: the model built or resumed, then the loop."""
    ckpt_path = os.path.join(c['out_dir'], CKPT_NAME)
    raw_model, optimizer, start = build_model(c, model_config, run, data_meta, ckpt_path)
    step, skipped, first_skipped = start['step'], start['skipped'], start['first_skipped']
    saved = step or None  # the step of this run's last checkpoint: the one resumed from, until the next save
    model = wrap_ddp(raw_model, run.device) if run.ddp else raw_model  # what the loop calls; raw_model: the GPT itself
    teacher = load_run_teacher(c, model_config, data_meta, run.device)
    peak_flops = c['peak_flops'] or default_peak_flops(  # of the step's matmuls: bf16 under autocast
        run.device, torch.bfloat16 if c['dtype'] == 'bfloat16' else torch.float32,
        gemm_shapes(raw_model, c['micro_batch_size'] * model_config.block_size))
    metrics = Metrics(c, run, step, wandb)
    for note in start_notes(c, val_data) if run.master else ():
        print(note, file=sys.stderr, flush=True)
    if start['lr_changes']:  # from the first step it applies to; a resume from this checkpoint again drops it
        metrics.write(dict(step=step + 1, event='resume_lr_change', **start['lr_changes']))
    if run.master:
        print(f"GPT: {raw_model.get_num_params():,} parameters, attention={model_config.attention}; "
              f"{run.world} rank(s) x {run.accumulation} micro-steps x {c['micro_batch_size']} sequences x "
              f"{model_config.block_size} tokens; "
              f"{'FSDP' if c['fsdp'] else 'DDP' if run.distributed else 'one process'}, {run.device}, {c['dtype']}"
              f"{', activation checkpointing' if c['activation_checkpointing'] else ''}; "
              f"{len(train_data):,} train windows; MFU of a {peak_flops / 1e12:.4g} TFLOP/s peak")
    teacher_timer = DeviceTimer(run.device)  # the teacher's forward time
    model.train()
    with preemption_flag() as stop_signal:
        while step < c['max_iters']:
            t0 = time.perf_counter()
            lr, loss, kd, ce, grad_norm, finite = take_step(c, run, model, raw_model, teacher, optimizer, train_data,
                                                            step, teacher_timer)
            alpha_means = raw_model.update_alpha_ma(discard=not finite)  # Eq. 9 with this step's global batch
            optimizer.zero_grad(set_to_none=not run.ddp)  # DDP: in place, the gradients are its buckets
            step, skipped, dt = step + 1, skipped + (not finite), time.perf_counter() - t0
            if not finite and first_skipped is None:
                first_skipped = step

            record = dict(step=step, lr=lr, loss=loss, grad_norm=grad_norm,
                          tokens_per_sec=c['global_batch_size'] * model_config.block_size / dt,
                          mfu=estimate_mfu(raw_model, c['global_batch_size'] / run.world, dt, peak_flops), dt=dt)
            if run.device.type == 'cuda':  # this rank's allocator peak so far, to hold against the memory plan
                record['peak_memory_gib'] = torch.cuda.max_memory_allocated(run.device) / 2 ** 30
            if teacher is not None:
                record.update(kd_loss=kd, ce_loss=ce, teacher_sec=teacher_timer.seconds())
            if c['nonfinite'] == 'skip':
                record['skipped_steps'] = skipped
            evaluated = step % c['eval_interval'] == 0 or step == c['max_iters']
            if evaluated:  # (nothing, where a signal cut it short: then saved below, unevaluated)
                record |= evaluation_record(c, run, model, raw_model, val_data, alpha_means, stop_signal)
            metrics.write(record)
            if skipped > c['max_skipped_frac'] * c['max_iters']:  # every rank counts the same: all stop here
                raise RunError(f"step {step}: the run has skipped {skipped} step(s) (non-finite loss or gradient "
                               f"norm), the first at step {first_skipped}: more than max_skipped_frac="
                               f"{c['max_skipped_frac']} of max_iters={c['max_iters']}; stopping without saving "
                               f"(out_dir's checkpoint, if any, is from before). To continue from it with a lower "
                               f"learning rate: --learning_rate=<lower> --resume_lr_change=True (or allow more: "
                               f"--max_skipped_frac)")
            stop = reduce_mean([float(bool(stop_signal))], run.device)[0] > 0  # all ranks stop at the same step
            if evaluated or stop:
                check_finite(step, record, raw_model, run.device, ckpt_path, saved)
                save(ckpt_path, step, dict(steps=skipped, first=first_skipped), c, run, raw_model, optimizer,
                     model_config, data_meta)
                saved = step
            if stop:
                if run.master:
                    cut = " (its evaluation, cut short, is not logged)" * (evaluated and 'val_loss' not in record)
                    print(f"stopped by a signal: saved {ckpt_path} at step {step}{cut}; the same command continues it",
                          flush=True)
                break
    if skipped and run.master:
        print(f"nonfinite=skip: {skipped} of the run's {step} steps were skipped (non-finite loss or gradient norm), "
              f"the first at step {first_skipped}", flush=True)


def main(argv):
    c = load_config(argv)
    try:
        model_config = ModelConfig(**{k: c[k] for k in FIELD_NAMES})
    except ValueError as e:  # ModelConfig's own checks (variant names, head counts, rope_scaling)
        raise RunError(f"config: {e}")
    if c['dry_run']:
        return print_dry_run(c, model_config)
    run = setup_run(c)
    wandb = import_wandb() if c['wandb_log'] and run.master else None
    data_meta, train_data, val_data = load_data(c, model_config)
    check_sizes(c, train_data, val_data)
    claim_dir(c['out_dir'], 'train.py', ours=lambda names: CKPT_NAME in names or is_run_config(c['out_dir']),
              writes=(CKPT_NAME, 'config.json', 'metrics.jsonl'))
    # one writer per run: rank 0, which alone writes into out_dir, holds it (and creates it) until the run ends
    with lock_dir(c['out_dir'], 'train.py') if run.master else nullcontext():
        train(c, model_config, run, data_meta, train_data, val_data, wandb)
    if run.distributed:
        dist.destroy_process_group()


if __name__ == '__main__':
    run_script(main)
