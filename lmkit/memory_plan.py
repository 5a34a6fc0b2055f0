"""
The memory plan: what one GPU holds at the peak of a training step, computed from the configs alone
before launching (docs/memory.md). Everything counted is here: the bytes a decoder layer saves for
backward (saved_bytes_per_token), the fused KD loss's working set (kd_loss_memory) and their sum per
component (memory_estimate), with the arguments a run's config gives it (memory_plan,
print_dry_run: a RunConfig's). `python train.py <config> --dry_run=True` prints it;
tools/memory_tables.py writes it into the docs' tables and, with --measure, holds it against
memory_measure.fake_peak_memory. Imports flow one way: data -> model -> fused_kd -> memory_plan ->
runs -> train, memory_measure, bench, gpu_check.
"""
import os

import torch

from lmkit.checkpoint import checkpoint_file, config_from_hf, read_checkpoint, read_hf_config
from lmkit.fused_kd import CHUNK_LOGITS, fp32_output_gemm
from model import FIELD_NAMES, GPT, MODEL_SHAPES, ModelConfig

# The paper's teachers by their checkpoint directory's name: a dry run sizes the teacher from its
# published shape (model.MODEL_SHAPES) when its checkpoint is not on this machine.
KNOWN_TEACHERS = {'Qwen1.5-1.8B': MODEL_SHAPES['qwen1.5-1.8b'],
                  'Llama-3.2-3B': MODEL_SHAPES['llama3.2-3b'],
                  'Llama-3.1-8B': MODEL_SHAPES['llama3.1-8b'],
                  'SmolLM2-360M': MODEL_SHAPES['smollm2-360m']}


def teacher_shape(spec):
    """(ModelConfig or None, where it came from) of a teacher, without reading its weights: the
    checkpoint's config if it is here, else KNOWN_TEACHERS by the directory's name, else None."""
    if os.path.exists(spec):
        path = checkpoint_file(spec)
        if path is None:
            return ModelConfig(**config_from_hf(read_hf_config(spec))), spec
        return ModelConfig(**read_checkpoint(path, keys=('model_config',))['model_config']), path
    name = os.path.basename(os.path.normpath(spec))
    if name in KNOWN_TEACHERS:
        return ModelConfig(
            **KNOWN_TEACHERS[name]), f"{name}'s published shape (no checkpoint at {spec})"
    return None, (f"unknown (no checkpoint at {spec}, and not one of {', '.join(KNOWN_TEACHERS)}): "
                  "teacher and KD terms left out, estimated as training without a teacher")


# repr(ModelConfig) -> meta_param_counts: a 3B model takes a fraction of a second to build
_PARAM_COUNTS = {}


def meta_param_counts(cfg):
    """(parameters of GPT(cfg), those of one decoder layer), counted on the meta device, once per
    config."""
    key = repr(cfg)
    if key not in _PARAM_COUNTS:
        with torch.device('meta'):
            model = GPT(cfg)
        layer = sum(p.numel() for p in model.model.layers[0].parameters())
        _PARAM_COUNTS[key] = model.get_num_params(), layer
    return _PARAM_COUNTS[key]


def no_more_saved(config, a, x_copy):
    return 0  # a forward that saves nothing for backward beyond softmax attention's


def affine_saved_bytes(config, a, x_copy):
    """alpha_proj's copy of X, alpha in float32 and its views, and the running mean of V in
    float32."""
    return x_copy + 12 * config.n_head + 4 * config.n_kv_head * config.head_dim


# The bytes per token a variant's forward saves for backward beyond softmax's, by its key in
# model.VARIANTS, as (config, a, x_copy) -> bytes: a is the bytes of one activation and x_copy those
# of autocast's copy of X (0 without one). A variant without an entry is planned as softmax, and
# the dry run says so.
SAVED_BYTES = {'softmax': no_more_saved, 'sink': no_more_saved, 'affine': affine_saved_bytes,
               'softmax1': no_more_saved}


def saved_bytes_per_token(config, dtype, fsdp):
    """Bytes autograd saves for backward per token in one decoder layer (Block.compute: the two
    RMSNorms, q/k/v, the attention output and log-sum-exp, the gate's and the variant's extras (its
    entry in SAVED_BYTES), the SwiGLU MLP), for dtype 'float32' or 'bfloat16' (bf16 autocast
    over fp32 weights, or FSDP's bf16 weights with fsdp=True). A change to the forward it counts
    (model.py) is a change here; tests/test_fsdp.py holds it against saved_tensors_hooks for every
    registered variant."""
    C, I, H = config.n_embd, config.intermediate_size, config.n_head
    HD, KVD = H * config.head_dim, config.n_kv_head * config.head_dim
    a = 4 if dtype == 'float32' else 2
    # fp32 weights under autocast: every linear keeps its own bf16 copy of its input (X's, for the
    # gate and a variant's)
    x_copy = 2 * C if dtype != 'float32' and not fsdp else 0
    # each RMSNorm keeps its input, normalised input and output (read by the linears)
    if dtype == 'float32':
        norms = 2 * (12 * C + 4)
    elif fsdp:  # bf16 weights: the input's fp32 upcast, then normalised and output in bf16
        norms = 2 * (8 * C + 4)
    else:  # fp32 weights under autocast: fp32 input and normalised, and 5 bf16 copies of the input
        norms = 2 * (8 * C + 4) + 5 * x_copy
    # k and v as the kernels save them: grouped in bf16 (flash takes GQA), repeated to every head in
    # float32 on CUDA (the memory-efficient kernel does not; kv_for_kernel)
    kv = 2 * (HD if dtype == 'float32' else KVD)
    # the gate's values per token: one per channel (Eq. 4-5), or one per head (Qiu et al.)
    gate = {'none': 0, 'elementwise': HD, 'headwise': H}[config.gate_kind]
    # q, attention output, o_proj's input, k, v; fp32 log-sum-exp
    return (norms + a * (3 * HD + kv) + 4 * H
            # g_proj's copy of X, the gate's input and its sigmoid
            + config.is_gated * (x_copy + a * HD) + a * gate
            # not planned: print_dry_run says so
            + SAVED_BYTES.get(config.variant_name, no_more_saved)(config, a, x_copy)
            + 4 * a * I)  # SwiGLU: gate and up outputs, silu, down_proj's input


def kd_loss_memory(n_tokens, vocab_size, student_hidden, teacher_hidden, compute_dtype,
                   student_weight_dtype=torch.float32, teacher_weight_dtype=None,
                   hidden_dtype=torch.float32,
                   temperature=1.0, kd_alpha=1.0, device_type='cuda', chunk_size=None):
    """Peak bytes fused_kd_loss allocates beyond its inputs in one training forward + backward (with
    targets, and gradients w.r.t. the student's hidden states and lm_head): n_tokens (N) tokens,
    vocab_size (V) rows, lm_heads student_hidden (C_s) and teacher_hidden (C_t) wide, GEMMs in
    compute_dtype, the inputs in the dtypes given (teacher_weight_dtype None: compute_dtype). The
    larger of the forward's and backward's peaks, tensor by tensor as docs/memory.md, "The fused KD
    loss", lists them; kernels' own workspaces are not counted."""
    N, V, C_s, C_t = n_tokens, vocab_size, student_hidden, teacher_hidden
    n = min(N, chunk_size or max(1, CHUNK_LOGITS // V))
    acc = torch.promote_types(compute_dtype, torch.float32)
    teacher_weight_dtype = teacher_weight_dtype or compute_dtype
    a, c, h = acc.itemsize, compute_dtype.itemsize, hidden_dtype.itemsize
    low = compute_dtype != acc  # GEMMs in bf16 / fp16 with float32 logits
    # planning for GPUs from elsewhere
    if low and device_type == 'cuda' and not torch.cuda.is_available():
        fallback = False
    else:
        fallback = low and not fp32_output_gemm(torch.device(device_type), compute_dtype)
    chunk = n * V * a  # one (n, V) float32 tensor
    low_grad = n * V * c if low else 0  # the gradient's compute-dtype copy
    working = max((4 if temperature != 1 and kd_alpha < 1 else 3) * chunk,
                  2 * chunk + (n * V * c if fallback else 0),
                  chunk + low_grad,
                  (low_grad or chunk) + n * C_s * (c + h) + (V * C_s * c if fallback else 0))
    # the chunk's hidden states; a dozen (n,) vectors of 8 bytes at most
    working += n * (C_s + C_t) * c + 128 * n
    held = V * C_s * a + N * C_s * h
    copies = (V * C_s * c if student_weight_dtype != compute_dtype else 0) + \
             (V * C_t * c if teacher_weight_dtype != compute_dtype else 0)
    scalars = 256  # the outputs, count, sums, grad_output, ...: a few dozen bytes
    forward = held + copies + N * (a + 1) + working + scalars
    backward = held + (N * C_s * (a + h) if hidden_dtype != acc else 0) + \
        (V * C_s * student_weight_dtype.itemsize if student_weight_dtype != acc else 0) + scalars
    return max(forward, backward)


def memory_estimate(cfg, world, micro_batch, dtype, fsdp, activation_checkpointing, teacher=None):
    """Bytes one GPU holds at the peak of a training step, by component (weights, gradients,
    optimizer, teacher, activations, kd_loss), for the student cfg on `world` ranks, micro_batch
    sequences of cfg.block_size tokens per forward, dtype 'float32' | 'bfloat16' (the compute dtype)
    and the teacher's ModelConfig (None: cross-entropy). The components peak at nearly the same
    moment, so their sum slightly overestimates the peak; the CUDA context, NCCL and fragmentation
    are not counted. What each holds: docs/memory.md."""
    n_params, per_layer = meta_param_counts(cfg)
    # FSDP's root group: embeddings, final norm, untied lm_head
    root = n_params - cfg.n_layer * per_layer
    a = 4 if dtype == 'float32' else 2  # bytes of a compute-dtype element
    N = micro_batch * cfg.block_size  # tokens per forward
    if fsdp:
        weights = 4 * n_params / world + a * (root + 2 * per_layer)
        grads = 4 * n_params / world + a * root + (a + 4) * per_layer
    else:
        weights = 4 * n_params + (2 * cfg.n_layer * per_layer if dtype == 'bfloat16' else 0)
        grads = 4 * n_params

    C, layer = cfg.n_embd, saved_bytes_per_token(cfg, dtype, fsdp)  # one decoder layer's
    # the residual stream: fp32 but under FSDP bf16
    layer_input = 2 * C if dtype == 'bfloat16' and fsdp else 4 * C
    if activation_checkpointing:
        activations = N * (cfg.n_layer * layer_input + 2 * layer)
    else:
        activations = N * (cfg.n_layer + 1) * layer
    activations += N * (8 * C + 4)  # the final RMSNorm

    estimate = dict(weights=weights, gradients=grads,
                    optimizer=8 * n_params / (world if fsdp else 1))
    V = cfg.vocab_size
    if teacher is not None:
        teacher_params = meta_param_counts(teacher)[0]
        # + its output, kept for the loss
        estimate['teacher'] = a * teacher_params + N * a * teacher.n_embd
        # the GEMMs' dtype: autocast's, or float32
        compute = torch.float32 if a == 4 else torch.bfloat16
        # FSDP gathers bf16; DDP: fp32 masters
        student_side = torch.bfloat16 if fsdp and a == 2 else torch.float32
        estimate['kd_loss'] = kd_loss_memory(N, V, C, teacher.n_embd, compute,
                                             student_weight_dtype=student_side,
                                             hidden_dtype=student_side, device_type='cuda')
    else:
        estimate['loss'] = N * V * (12 + (4 if a == 2 else 0))
    estimate['activations'] = activations
    return estimate


def verdict(total_gib, gpu_gib):
    """Whether a plan of total_gib fits one GPU of gpu_gib: 'fits' with 10% of the GPU left for what
    the plan does not count (the CUDA context, NCCL, fragmentation), 'tight' under that margin, else
    'no'."""
    return 'fits' if total_gib <= 0.9 * gpu_gib else 'tight' if total_gib <= gpu_gib else 'no'


def planned_models(run):
    """(the student's ModelConfig, the teacher's or None) of a run (its RunConfig, lmkit.runs), as
    its dry run sizes them: the teacher from its checkpoint, or from its published shape when it is
    not on this machine."""
    return (ModelConfig(**{key: getattr(run, key) for key in FIELD_NAMES}),
            teacher_shape(run.teacher)[0] if run.teacher else None)


def plan_dtype(run):
    # auto: bf16 on the GPUs the plan is for
    return 'bfloat16' if run.dtype == 'auto' else run.dtype


def memory_plan(run, model_config, teacher_config):
    """memory_estimate's bytes per GPU by component for a run (its RunConfig), as its dry run plans
    it."""
    return memory_estimate(model_config, run.dry_run_world_size, run.micro_batch_size,
                           plan_dtype(run), run.fsdp, run.activation_checkpointing, teacher_config)


def print_dry_run(run, model_config):
    """The dry run of a run (its RunConfig): parameter counts, and memory_plan's table per GPU on
    its dry_run_world_size GPUs of dry_run_gpu_gib."""
    with torch.device('meta'):
        model = GPT(model_config)
    total = model.get_num_params()
    embedding = model.model.embed_tokens.weight.numel() + (0 if model_config.tie_embeddings else
                                                           model.lm_head.weight.numel())
    print(f"params: total={total} non_embedding={total - embedding} "
          f"attention_extra={model.get_num_params(variant_only=True)}")
    world, micro_batch, gpu_gib = run.dry_run_world_size, run.micro_batch_size, run.dry_run_gpu_gib
    teacher, source = teacher_shape(run.teacher) if run.teacher else (None, 'none (cross-entropy)')
    estimate = memory_plan(run, model_config, teacher)
    total = sum(estimate.values()) / 2 ** 30
    said = dict(fits='fits', tight='tight: under 10% left for the CUDA context, NCCL and '
                                   'fragmentation',
                no='does not fit')[verdict(total, gpu_gib)]
    accumulation, rest = divmod(run.global_batch_size, world * micro_batch)
    steps = (f"{accumulation} "
             "micro-steps" if accumulation and not rest
             else f"global_batch_size={run.global_batch_size} is not a multiple of {world} x "
                  f"{micro_batch}: a run would stop")
    print(f"memory per GPU, estimated: {'FSDP' if run.fsdp else 'DDP'} on {world} GPUs, "
          f"micro_batch_size={micro_batch} x {model_config.block_size} tokens ({steps}), "
          f"{plan_dtype(run)}, activation_checkpointing={run.activation_checkpointing}; teacher: "
          f"{source}")
    for name, value in estimate.items():
        print(f"  {name:<12} {value / 2 ** 30:7.2f} GiB")
    print(f"  {'total':<12} {total:7.2f} GiB of {gpu_gib:g}: {said}")
    if model_config.variant_name not in SAVED_BYTES:
        print(f"  {model_config.attention}: activation memory not planned (memory_plan.SAVED_BYTES "
              "has no entry for it): counted as softmax attention's")
