"""
What train.py is built from and other tools reuse: its settings (KEYS, each with its range) and their loading
(load_config), the plan of a run from them (planned_run: new, partial, done or changed), the loss of a micro-step
(compute_loss: CE or KD), AdamW's parameter groups (configure_optimizers), and the matched initialisation of the
sink study's pairs (init_matched).
"""
import dataclasses
import hashlib
import os
from contextlib import nullcontext

import torch

from configurator import DEVICE, Key, parse
from lmkit.checkpoint import CKPT_NAME, read_checkpoint
from lmkit.device import resolve_device, resolve_dtype
from lmkit.resume import changed_settings, recorded_config
from distill import fused_kd_loss, kd_loss
from model import AFFINE_ACTS, AFFINE_BIAS_NORMS, ATTENTIONS, MODEL_SHAPES, ModelConfig


def init_matched(model, seed):
    """A GPT's init again, each module from a generator seeded by (seed, its name) alone rather than one stream in
    module order: variants built from one seed then start equal in every tensor they share and differ in their own
    (train.py's matched_init; the sink study's matched pairs). The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            torch.manual_seed(int.from_bytes(hashlib.sha256(f'{seed}:{name}'.encode()).digest()[:8], 'little'))
            model._init_weights(module)


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
    matched_init=Key(False, "initialise each module from (seed, its name) alone (lmkit.training.init_matched): "
                     "variants of one seed then share every initial tensor they have in common; False: one stream in "
                     "module order"),
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
RULES = ('min_lr <= learning_rate', "out_dir != ''")  # an empty out_dir would write into the working folder


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


def load_config(argv, description=''):
    """Defaults <- config files <- --key=value overrides, each key checked (configurator.py); description: what
    --help says above the keys (train.py's own docstring)."""
    return parse(argv, KEYS, description, files=True, prog='train.py', rules=RULES)


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
