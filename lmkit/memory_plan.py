"""The memory plan: what one GPU holds at the peak of a training step, from the configs alone
(docs/memory.md): train.py --dry_run=True prints it and tools/memory_tables.py tabulates it."""
import os

import torch

from lmkit.checkpoint import checkpoint_file, config_from_hf, read_checkpoint, read_hf_config
from lmkit.fused_kd import CHUNK_LOGITS, fp32_output_gemm
from model import FIELD_NAMES, GPT, MODEL_SHAPES, ModelConfig

# The paper's teachers by directory name: a dry run without their checkpoints uses these shapes
KNOWN_TEACHERS = {name: MODEL_SHAPES[shape] for name, shape in (
    ('Qwen1.5-1.8B', 'qwen1.5-1.8b'), ('Llama-3.2-3B', 'llama3.2-3b'),
    ('Llama-3.1-8B', 'llama3.1-8b'), ('SmolLM2-360M', 'smollm2-360m'))}


def teacher_shape(spec):
    """(ModelConfig or None, where it came from) of a teacher, without reading its weights: the
    checkpoint's config if it is here, else KNOWN_TEACHERS by the directory's name, else None."""
    if os.path.exists(spec):
        if (path := checkpoint_file(spec)) is None:
            return ModelConfig(**config_from_hf(read_hf_config(spec))), spec
        return ModelConfig(**read_checkpoint(path, keys=('model_config',))['model_config']), path
    if (name := os.path.basename(os.path.normpath(spec))) in KNOWN_TEACHERS:
        source = f"{name}'s published shape (no checkpoint at {spec})"
        return ModelConfig(**KNOWN_TEACHERS[name]), source
    return None, (f"unknown (no checkpoint at {spec}, and not one of {', '.join(KNOWN_TEACHERS)}): "
                  "teacher and KD terms left out, estimated as training without a teacher")


_PARAM_COUNTS = {}  # by repr(ModelConfig): building a 3B model takes a fraction of a second


def meta_param_counts(cfg):
    """(parameters of GPT(cfg), those of one decoder layer), counted on the meta device."""
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
    """alpha_proj's copy of X, alpha in float32 and its views, and V's running mean in float32."""
    return x_copy + 12 * config.n_head + 4 * config.n_kv_head * config.head_dim


# Bytes per token a variant's forward saves for backward beyond softmax's, by its model.VARIANTS
# key, from (config, a, x_copy): a is one activation's bytes, x_copy autocast's copy of X's (or 0).
SAVED_BYTES = {'softmax': no_more_saved, 'sink': no_more_saved, 'affine': affine_saved_bytes,
               'softmax1': no_more_saved}


def saved_bytes_per_token(config, dtype, fsdp):
    """Bytes autograd saves per token in one decoder layer (Block.compute), for dtype 'float32' or
    'bfloat16' (autocast over fp32 weights, or FSDP's bf16 weights). tests/test_fsdp.py holds it
    against saved_tensors_hooks for every variant: a change to model.py's forward changes it."""
    C, I, H = config.n_embd, config.intermediate_size, config.n_head
    HD, KVD = H * config.head_dim, config.n_kv_head * config.head_dim
    a = 4 if dtype == 'float32' else 2
    # under autocast over fp32 weights, every linear keeps its own bf16 copy of its input
    x_copy = 2 * C if dtype != 'float32' and not fsdp else 0
    # Each RMSNorm keeps its input, normalised input and output: 12C bytes in float32, 8C in bf16
    # (FSDP: the input's fp32 upcast, then bf16; autocast: the fp32 input and normalised input), and
    # under autocast q, k, v, gate and up keep bf16 copies of the outputs.
    norms = 2 * (12 * C + 4) if dtype == 'float32' else 2 * (8 * C + 4) + 5 * x_copy
    # k, v as kernels save them: bf16 at n_kv_head (flash takes GQA), fp32 per head (kv_for_kernel)
    kv = 2 * (HD if dtype == 'float32' else KVD)
    # the gate's values per token: one per channel (Eq. 4-5), or one per head (Qiu et al.)
    gate = {'none': 0, 'elementwise': HD, 'headwise': H}[config.gate_kind]
    variant = SAVED_BYTES.get(config.variant_name, no_more_saved)(config, a, x_copy)
    return (norms + a * (3 * HD + kv) + 4 * H  # q, attention output, o_proj's input, k, v; LSE
            + config.is_gated * (x_copy + a * HD) + a * gate  # g_proj's X, its input and sigmoid
            + variant + 4 * a * I)  # SwiGLU: gate and up outputs, silu, down_proj's input


def kd_loss_memory(N, V, C_s, C_t, compute_dtype, student_weight_dtype=torch.float32,
                   teacher_weight_dtype=None, hidden_dtype=torch.float32, temperature=1.0,
                   kd_alpha=1.0, device_type='cuda', chunk_size=None):
    """Peak bytes fused_kd_loss allocates beyond its inputs in a training step of N tokens, V rows
    and lm_heads C_s and C_t wide, with targets and the dtypes given (teacher_weight_dtype None:
    compute_dtype), tensor by tensor as docs/memory.md, "The fused KD loss", lists them."""
    n = min(N, chunk_size or max(1, CHUNK_LOGITS // V))
    acc = torch.promote_types(compute_dtype, torch.float32)
    a, c, h = acc.itemsize, compute_dtype.itemsize, hidden_dtype.itemsize
    low = compute_dtype != acc  # GEMMs in bf16 / fp16 with float32 logits
    # without float32-output GEMMs, bf16 products come first (a GPU planned from elsewhere has them)
    fallback = low and (device_type != 'cuda' or torch.cuda.is_available()) and \
        not fp32_output_gemm(torch.device(device_type), compute_dtype)
    chunk = n * V * a  # one (n, V) float32 tensor
    low_grad = n * V * c if low else 0  # the gradient's compute-dtype copy
    working = max((4 if temperature != 1 and kd_alpha < 1 else 3) * chunk,
                  2 * chunk + (n * V * c if fallback else 0),
                  chunk + low_grad,
                  (low_grad or chunk) + n * C_s * (c + h) + (V * C_s * c if fallback else 0))
    working += n * (C_s + C_t) * c + 128 * n  # hidden states; a dozen (n,) vectors of <= 8 bytes
    held = V * C_s * a + N * C_s * h
    copies = ((V * C_s * c if student_weight_dtype != compute_dtype else 0)
              + (V * C_t * c if teacher_weight_dtype not in (None, compute_dtype) else 0))
    scalars = 256  # the outputs, count, sums, grad_output, ...: a few dozen bytes
    forward = held + copies + N * (a + 1) + working + scalars
    backward = (held + (N * C_s * (a + h) if hidden_dtype != acc else 0) + scalars
                + (V * C_s * student_weight_dtype.itemsize if student_weight_dtype != acc else 0))
    return max(forward, backward)


def memory_estimate(cfg, world, micro_batch, dtype, fsdp, activation_checkpointing, teacher=None):
    """Bytes one GPU holds at the peak of a training step by component, for the student cfg on
    `world` ranks, micro_batch sequences per forward, dtype 'float32' or 'bfloat16' and the
    teacher's ModelConfig or None (docs/memory.md, "How memory_plan.memory_estimate builds it")."""
    P, per_layer = meta_param_counts(cfg)
    root = P - cfg.n_layer * per_layer  # FSDP's root group: embeddings, norm, lm_head
    a = 4 if dtype == 'float32' else 2  # bytes of a compute-dtype element
    N, C, V = micro_batch * cfg.block_size, cfg.n_embd, cfg.vocab_size  # N: tokens per forward
    if fsdp:
        weights = 4 * P / world + a * (root + 2 * per_layer)
        grads = 4 * P / world + a * root + (a + 4) * per_layer
    else:
        weights = 4 * P + (2 * cfg.n_layer * per_layer if dtype == 'bfloat16' else 0)
        grads = 4 * P
    estimate = dict(weights=weights, gradients=grads, optimizer=8 * P / (world if fsdp else 1))
    if teacher is None:
        estimate['loss'] = N * V * (12 + (4 if a == 2 else 0))
    else:  # the teacher's weights, and its output kept for the loss
        estimate['teacher'] = a * meta_param_counts(teacher)[0] + N * a * teacher.n_embd
        compute = torch.float32 if a == 4 else torch.bfloat16  # the GEMMs': autocast's or float32
        student_side = torch.bfloat16 if fsdp and a == 2 else torch.float32  # FSDP's bf16 or fp32
        estimate['kd_loss'] = kd_loss_memory(N, V, C, teacher.n_embd, compute, student_side,
                                             hidden_dtype=student_side, device_type='cuda')
    # per token: every layer's saved tensors and one layer's gradients in flight, or with activation
    # checkpointing each layer's input (the residual stream), one recomputed layer and its gradients
    layer = saved_bytes_per_token(cfg, dtype, fsdp)
    layer_input = 2 * C if dtype == 'bfloat16' and fsdp else 4 * C
    saved = (cfg.n_layer * layer_input + 2 * layer if activation_checkpointing
             else (cfg.n_layer + 1) * layer)
    estimate['activations'] = N * saved + N * (8 * C + 4)  # and the final RMSNorm's
    return estimate


def verdict(total_gib, gpu_gib):
    """'fits' with 10% of the GPU free for what plans leave out, 'tight' with less, else 'no'."""
    return 'fits' if total_gib <= 0.9 * gpu_gib else 'tight' if total_gib <= gpu_gib else 'no'


def planned_models(run):
    """(the student's ModelConfig, the teacher's or None) of a run (a RunConfig), as planned."""
    return (ModelConfig(**{key: getattr(run, key) for key in FIELD_NAMES}),
            teacher_shape(run.teacher)[0] if run.teacher else None)


def plan_dtype(run):
    return 'bfloat16' if run.dtype == 'auto' else run.dtype  # auto: bf16 on the GPUs planned for


def memory_plan(run, model_config, teacher_config):
    """memory_estimate's bytes per GPU by component for a run (its RunConfig), as its dry run."""
    return memory_estimate(model_config, run.dry_run_world_size, run.micro_batch_size,
                           plan_dtype(run), run.fsdp, run.activation_checkpointing, teacher_config)


def print_dry_run(run, model_config):
    """A run's dry run: its parameter counts and memory_plan's table per GPU, with a verdict."""
    with torch.device('meta'):
        model = GPT(model_config)
    total = model.get_num_params()
    embedding = model.model.embed_tokens.weight.numel() + (
        0 if model_config.tie_embeddings else model.lm_head.weight.numel())
    print(f"params: total={total} non_embedding={total - embedding} "
          f"attention_extra={model.get_num_params(variant_only=True)}")
    world, micro_batch, gpu_gib = run.dry_run_world_size, run.micro_batch_size, run.dry_run_gpu_gib
    teacher, source = teacher_shape(run.teacher) if run.teacher else (None, 'none (cross-entropy)')
    estimate = memory_plan(run, model_config, teacher)
    total = sum(estimate.values()) / 2 ** 30
    accumulation, rest = divmod(run.global_batch_size, world * micro_batch)
    steps = (f"{accumulation} micro-steps" if accumulation and not rest
             else f"global_batch_size={run.global_batch_size} is not a multiple of {world} x "
                  f"{micro_batch}: a run would stop")
    print(f"memory per GPU, estimated: {'FSDP' if run.fsdp else 'DDP'} on {world} GPUs, "
          f"micro_batch_size={micro_batch} x {model_config.block_size} tokens ({steps}), "
          f"{plan_dtype(run)}, activation_checkpointing={run.activation_checkpointing}; teacher: "
          f"{source}")
    for name, value in estimate.items():
        print(f"  {name:<12} {value / 2 ** 30:7.2f} GiB")
    said = dict(fits='fits', no='does not fit',
                tight='tight: under 10% left for the CUDA context, NCCL and fragmentation')
    print(f"  {'total':<12} {total:7.2f} GiB of {gpu_gib:g}: {said[verdict(total, gpu_gib)]}")
    if model_config.variant_name not in SAVED_BYTES:
        print(f"  {model_config.attention}: activation memory not planned (memory_plan.SAVED_BYTES "
              "has no entry for it): counted as softmax attention's")
