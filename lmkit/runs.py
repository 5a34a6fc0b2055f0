"""
What other programs need to know about a train.py run: its keys (KEYS, load_config, RunConfig), its optimizer
(configure_optimizers), its out_dir and checkpoint (claim_out_dir, save_run_checkpoint), the one rule for continuing
it (RESUME_MAY_CHANGE, resume_point, planned_run), and its records read back (load_run, spike_counts). train.py and
this module read the run's config by key; every other module takes named arguments or a RunConfig.
"""
import dataclasses
import json
import math
import os
import random
import sys

import numpy as np
import torch

from configurator import DEVICE, Key, parse
from lmkit.checkpoint import (CKPT_KEYS, CKPT_NAME, CheckpointError, is_run_config, model_state,
                              previous_checkpoint, read_checkpoint, save_checkpoint)
from lmkit.distributed import resolve_device, resolve_dtype
from lmkit.errors import RunError
from lmkit.files import atomic_write, claim_dir, lock_dir, read_log, set_aside, write_json
from lmkit.memory_plan import memory_estimate, print_dry_run, teacher_shape
from model import (AFFINE_ACTS, AFFINE_BIAS_NORMS, ATTENTIONS, FIELD_NAMES, GATED_NAMES, MODEL_SHAPES,
                   ModelConfig)

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
    matched_init=Key(False, "initialise each module from (seed, its name) alone (train.init_matched): "
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
# train.start_notes warns)
RULES = ('min_lr <= learning_rate', "out_dir != ''")  # an empty out_dir would write into the working folder


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


# A run's config as a typed object, for every module but train.py and this one: its keys as attributes (a misspelt
# one is an AttributeError), read-only; run_config builds it from a config dict, a key it predates at its default.
RunConfig = dataclasses.make_dataclass('RunConfig', list(KEYS), frozen=True)


def run_config(config):
    """The RunConfig of a config dict: load_config's, or a checkpoint's or a config.json's (recorded_config)."""
    config = recorded_config(config)[0]
    return RunConfig(**{key: config[key] for key in KEYS})


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
    """(RunConfig, step, changed) of the train.py command `argv` (a config file, then overrides; run in cwd) beside
    the checkpoint its out_dir holds: the config train.py would resolve, the step the checkpoint reached (None: none),
    and changed_settings' changes as 'key old -> new', max_iters among them (the plans train a changed run again
    from scratch: RESTART)."""
    c = load_config(argv)
    c['dtype'] = resolve_dtype(c['dtype'], resolve_device(c['device']))  # as setup_run resolves it
    path = os.path.join(cwd, c['out_dir'], CKPT_NAME)
    if not os.path.exists(path):
        return run_config(c), None, []
    then = read_checkpoint(path, keys=('step', 'config'))
    changed = changed_settings(recorded_config(then['config'])[0], c, also=('max_iters',))
    return run_config(c), then['step'], [f"{key} {before!r} -> {after!r}" for key, before, after in changed]


# What may differ between a checkpoint's run and the run that continues it: nothing here changes what a step
# computes (the data of step s depends only on (seed, s, global_batch_size), not on the ranks or the micro-batch).
# max_iters may grow to extend a run; note that with decay_frac > 0 the decay then starts later than it would have.
# Every other training key, and the model, must be the same; data_dir may move, but must hold the same data.
RESUME_MAY_CHANGE = {'out_dir', 'data_dir', 'init_from', 'overwrite', 'keep_previous', 'max_iters', 'micro_batch_size',
                     'eval_interval', 'eval_batches', 'log_interval', 'nonfinite', 'max_skipped_frac', 'device',
                     'compile', 'peak_flops', 'wandb_log', 'wandb_project', 'wandb_run_name', 'kd_loss', 'fsdp',
                     'activation_checkpointing', 'dry_run', 'dry_run_world_size', 'dry_run_gpu_gib', 'resume_lr_change',
                     'attention_windows'}
# What a resume may change only when asked to (resume_lr_change=True): the continued run is then not the same run,
# so the change is recorded in metrics.jsonl, at the first step it applies to.
LR_KEYS = ('learning_rate', 'min_lr')


RESTART = ['--init_from=scratch', '--overwrite=True']  # train.py's arguments that train a run again from scratch


def restart_note(out_dir, changes):
    """What the quick start and the sink study say of a run they train again from scratch (RESTART)."""
    return (f"changed since {out_dir} was trained: {'; '.join(changes)}. Training it again from scratch, replacing its "
            f"checkpoint and config.json (its metrics.jsonl is kept aside, under a new name)")



def recorded_config(config):
    """(A checkpoint's config (its dict) with every key added since it was written at its default, those keys): a
    key is added with the default that does what the code did before it, so that is what the checkpoint's run did."""
    missing = [key for key in KEY_DEFAULTS if key not in config]
    return {**config, **{key: KEY_DEFAULTS[key] for key in missing}}, missing


def changed_settings(old, new, also=()):
    """[(key, old value, new value)] of the settings (dicts) whose change makes a continued run another run: every key
    outside RESUME_MAY_CHANGE, and those of `also`. The one rule for continuing a run: train.py's resume
    (check_resumable), and the quick start's and the sink study's plans (planned_run, with
    also=('max_iters',))."""
    return [(key, old[key], new[key]) for key in sorted(new)
            if (key in also or key not in RESUME_MAY_CHANGE) and old[key] != new[key]]


def check_resumable(ckpt, c, model_config, data_meta, path):
    """RunError listing everything that would make continuing the checkpoint `ckpt` with config `c` differ from the
    run that wrote it: the model, a training key outside RESUME_MAY_CHANGE, or the data (its tokenizer and size).
    Returns the keys the checkpoint predates, taken at their defaults (recorded_config)."""
    old, missing = recorded_config({**ckpt['config'], **ckpt['model_config']})
    changed = [f"{key}: {before!r} -> {after!r}" for key, before, after in
               changed_settings(old, {**c, **dataclasses.asdict(model_config)})]
    if ckpt['data'] != data_fingerprint(data_meta):
        changed.append(f"the data: {ckpt['data']} -> {data_fingerprint(data_meta)} (data_dir={c['data_dir']})")
    if changed:
        raise RunError(f"{path} was written by a different run; continuing it with these settings would not be the "
                       f"same run:\n  - " + "\n  - ".join(changed) + f"\nKeys that may change on resume: "
                       f"{', '.join(sorted(RESUME_MAY_CHANGE))}; {' and '.join(LR_KEYS)} with --resume_lr_change=True "
                       f"(recorded in metrics.jsonl). To start a new run instead: another --out_dir, or "
                       f"--init_from=scratch --overwrite=True.")
    return {key: old[key] for key in missing}


def lr_changes(ckpt, c):
    """{key: {'from': the checkpoint's, 'to': this run's}} of the LR_KEYS that this resume changes, where
    resume_lr_change=True allows it (else {}: check_resumable then refuses a change)."""
    if not c['resume_lr_change']:
        return {}
    return {key: {'from': ckpt['config'][key], 'to': c[key]} for key in LR_KEYS if ckpt['config'][key] != c[key]}


def data_fingerprint(meta):
    """What identifies a prepare_data.py directory's contents (its meta.json): the tokenizer and each split's size."""
    return dict(tokenizer=meta['tokenizer']['sha256'],
                **{f'{split}_tokens': info['tokens'] for split, info in sorted(meta['splits'].items())})


def rng_state():
    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state):
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if state['cuda'] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def checkpoint_to_resume(c, ckpt_path):
    """out_dir's checkpoint if this run continues it (init_from), else None; refuses to replace one unasked."""
    exists, previous = os.path.isfile(ckpt_path), previous_checkpoint(ckpt_path)
    if not exists and os.path.isfile(previous) and not c['overwrite']:
        raise RunError(f"{previous} is there without {ckpt_path}: to continue from it, mv {previous} {ckpt_path}; "
                       f"to start over (replacing it): --init_from=scratch --overwrite=True")
    if c['init_from'] == 'resume' and not exists:
        raise RunError(f"init_from=resume: no checkpoint at {ckpt_path}")
    if not exists:
        return None
    try:
        ckpt = read_checkpoint(ckpt_path, keys=CKPT_KEYS)
    except CheckpointError as e:
        raise RunError(f"init_from={c['init_from']}: {e} (--init_from=scratch --overwrite=True starts the run over)")
    if c['init_from'] == 'scratch' and not c['overwrite']:
        raise RunError(f"{ckpt_path} holds a run at step {ckpt['step']}, which init_from=scratch would replace at "
                       f"its first save. To continue it: --init_from=auto (the default). To start over and "
                       f"replace it: --init_from=scratch --overwrite=True. Or choose another --out_dir.")
    return None if c['init_from'] == 'scratch' else ckpt


def resume_point(c, model_config, data_meta, path):
    """(checkpoint or None, lr_changes, predated keys) of the run c in out_dir: the checkpoint it continues, its
    model tensors under plain names (model_state), checked to be the same run (check_resumable) but for the
    learning-rate keys resume_lr_change lets it change, and the keys it predates, at their defaults."""
    ckpt = checkpoint_to_resume(c, path)
    if ckpt is None:
        return None, {}, {}
    changes = lr_changes(ckpt, c)  # asked for: not a difference to refuse
    predated = check_resumable(ckpt, {**c, **{key: change['from'] for key, change in changes.items()}},
                               model_config, data_meta, path)
    return {**ckpt, 'model': model_state(ckpt)}, changes, predated


def save_run_checkpoint(path, c, step, skipped, model_state_dict, optimizer_state, model_config, data_meta):
    """A run's ckpt.pt: what resume_point reads back. skipped: {'steps': how many nonfinite='skip' skipped,
    'first': the first one's step}."""
    save_checkpoint(path, dict(model=model_state_dict, optimizer=optimizer_state, step=step, rng=rng_state(),
                               config=c, model_config=dataclasses.asdict(model_config),
                               tokenizer=data_meta['tokenizer'], data=data_fingerprint(data_meta),
                               skipped=skipped), keep_previous=c['keep_previous'])


def planned_models(run):
    """(the student's ModelConfig, the teacher's or None) of a RunConfig, as its dry run sizes them: the teacher
    from its checkpoint, or from its published shape when it is not on this machine (teacher_shape)."""
    return (ModelConfig(**{key: getattr(run, key) for key in FIELD_NAMES}),
            teacher_shape(run.teacher)[0] if run.teacher else None)


def plan_dtype(run):
    return 'bfloat16' if run.dtype == 'auto' else run.dtype  # auto: bf16 on the GPUs the plan is for


def memory_plan(run, model_config, teacher_config):
    """memory_plan.memory_estimate's bytes per GPU by component for a RunConfig, as its dry run plans it."""
    return memory_estimate(model_config, run.dry_run_world_size, run.micro_batch_size, plan_dtype(run), run.fsdp,
                           run.activation_checkpointing, teacher_config)


def dry_run(c, model_config):
    """train.py --dry_run=True: parameter counts and the memory plan on dry_run_world_size GPUs (print_dry_run)."""
    run = run_config(c)
    print_dry_run(model_config, run.teacher, run.dry_run_world_size, run.micro_batch_size, run.global_batch_size,
                  plan_dtype(run), run.fsdp, run.activation_checkpointing, run.dry_run_gpu_gib)


RUN_FILES = (CKPT_NAME, 'config.json', 'metrics.jsonl')  # what a run writes into its out_dir


def start_log(c, start_step):
    """out_dir's config.json, and its metrics.jsonl as a run starts it, whose path is returned: a resume keeps the
    records up to its checkpoint's step (a crash may have left later ones); a fresh start never replaces a log, an
    earlier one is kept aside under a new name (files.set_aside), said in one line."""
    path = os.path.join(c['out_dir'], 'metrics.jsonl')
    kept = []
    if start_step and os.path.isfile(path):
        kept = [record for record in read_log(path) if record['step'] <= start_step]
    elif os.path.isfile(path) and os.path.getsize(path):
        print(f"note: {path} holds the log of an earlier run in {c['out_dir']}, which this one does not continue: "
              f"kept as {set_aside(path)}; a new log begins", file=sys.stderr, flush=True)
    write_json(os.path.join(c['out_dir'], 'config.json'), c)
    with atomic_write(path) as f:
        f.writelines(json.dumps(record) + '\n' for record in kept)
    return path


def checkpoint_path(out_dir):
    return os.path.join(out_dir, CKPT_NAME)


def claim_out_dir(out_dir):
    """RunError, before any work, where out_dir holds another program's files or files a run would write over
    (files.claim_dir); an earlier run's own out_dir is claimed again."""
    claim_dir(out_dir, 'train.py', ours=lambda names: CKPT_NAME in names or is_run_config(out_dir),
              writes=RUN_FILES)


def hold_out_dir(out_dir):
    """One writer per run: the holder (rank 0) creates out_dir and holds it until the run ends (files.lock_dir)."""
    return lock_dir(out_dir, 'train.py')
def pyplot():
    import matplotlib
    matplotlib.use('Agg')  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def grad_norm_statistics(grad_norms, start=0, end=500):
    """Table 4 over steps [start, end) of the raw (unclipped) gradient norms: mean, standard deviation and
    variance (population, ddof = 0) and the coefficient of variation std / mean."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    mean, std = g.mean(), g.std()
    return dict(mean=mean, std=std, variance=std ** 2, cv=std / mean if mean else math.nan)


def spike_counts(grad_norms, ks=(6, 9), start=0, end=500):
    """Table 5: the number of steps in [start, end) whose gradient norm exceeds median(g) + k * MAD(g), with
    MAD(g) = median(|g - median(g)|), the raw median absolute deviation (no 1.4826 normal-consistency factor;
    the paper does not give one)."""
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} steps")
    median = np.median(g)
    mad = np.median(np.abs(g - median))
    return {k: int((g > median + k * mad).sum()) for k in ks}


def load_run(out_dir):
    """A train.py run: its metrics.jsonl step records (files.read_log; events, such as a resume's learning-rate
    change, left out) and config.json (the resolved training and model config). A log holding a step twice (two
    writers at once, or logs pasted together) is refused: its statistics would count those steps twice."""
    path = os.path.join(out_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        raise RunError(f"{out_dir}: no metrics.jsonl (not a train.py out_dir)")
    records, lines = [], {}
    for number, record in enumerate(read_log(path), 1):
        if 'event' in record:
            continue
        if record['step'] in lines:
            raise RunError(f"{path}: step {record['step']} is on lines {lines[record['step']]} and {number}: two "
                           f"train.py wrote this log at once (before runs were locked) or logs were joined; keep "
                           f"one record per step (one run's lines) and run analyze.py again")
        lines[record['step']] = number
        records.append(record)
    if not records:
        raise RunError(f"{path}: empty (the run has not finished a step)")
    config_path = os.path.join(out_dir, 'config.json')
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    return dict(dir=out_dir, config=config, records=records, method=method_name(config), objective=objective(config))


def method_name(config):
    """The paper's name for a model config (a dict): its variant's display name (Variant.display; GATED_NAMES' with the
    gate), then its options (Variant.options), so that the sigmoid ablation of Table 3 says so."""
    config = ModelConfig(**{key: value for key, value in config.items() if key in FIELD_NAMES})
    of = config.variant_name
    name = config.variant.display or of
    if config.is_gated:  # the paper's name for it with the gate, if the paper has one
        name = next((shown for base, shown in GATED_NAMES.values() if base == of), f'{name} + Gated')
    return name + config.variant.options(config)


def objective(config):
    """What a run minimised: 'CE' (cross-entropy on the data), or 'KD from <teacher>' with kd_alpha and
    kd_temperature where they are not the paper's 1.0. Losses of different objectives are not comparable."""
    if not config.get('teacher'):
        return 'CE'
    settings = ''.join(f", {key}={config[key]}" for key in ('kd_alpha', 'kd_temperature')
                       if config.get(key, 1.0) != 1.0)
    return f"KD from {config['teacher']}{settings}"
