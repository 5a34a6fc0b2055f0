"""The GPU path, checked on every CI run without a GPU:
  - the real 1B and 3B shapes as fake CUDA tensors (FakeTensorMode: every op's output shape, dtype
    and device, no memory, no kernel): the GEMMs of the student, the teacher and the KD loss run in
    bf16 (float32 only out of the KD loss's float32-output GEMMs), attention runs on the fused CUDA
    kernels with K/V at n_kv_head, alpha_ma stays float32, and no T x T tensor exists;
  - the dry run's memory plan (lmkit/memory_plan.py) against torch's MemTracker on fake tensors of a
    real-shape step;
  - compiled training and evaluation under DDP and FSDP (2 gloo ranks, dynamo with the aot_eager
    backend): no graph break, no recompilation after the first step and its evaluation, no DDP
    graph splitting, DDP's gradients kept once.
CUDA autograd cannot run on fake CUDA tensors in a CPU-only build (autograd's C++ asks the device
for a stream), so the CUDA checks are of forwards; the memory plan's training step (forward and
backward) runs on fake CPU tensors."""
import dataclasses
import re
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lmkit import distributed
from lmkit import measure
from lmkit import fused_kd
from tools import gpu_check
from tools import memory_measure
from lmkit import memory_plan, runs
import train
from lmkit.data import Windows
from model import ATTENTIONS, FIELD_NAMES, GPT, MODEL_SHAPES, ModelConfig

torch.set_num_threads(2)
aten = torch.ops.aten

# The paper's rows: the student's shape, its teacher's, and how train.py runs it
# (config/affine_1b.py, config/affine_3b.py): DDP with float32 master weights under bf16 autocast,
# or FSDP2 computing in bf16 weights
ROWS = {'1B': ('llama3.2-1b', 'llama3.2-3b', 'ddp'), '3B': ('llama3.2-3b', 'llama3.1-8b', 'fsdp')}
MICRO_BATCH = 4  # the configs' micro_batch_size
GEMMS = {aten.mm, aten.addmm, aten.addmm_, aten.bmm, aten.baddbmm, aten.baddbmm_, aten.addbmm,
         aten.addbmm_, aten.mv, aten.addmv, aten.addmv_, aten.dot, aten.matmul, aten.linear}
FUSED_ATTENTION = {aten._scaled_dot_product_flash_attention,
                   aten._scaled_dot_product_efficient_attention,
                   aten._scaled_dot_product_cudnn_attention}


# -----------------------------------------------------------------------------
# Fake CUDA tensors


def index(t, key):
    """t[key] for basic indexing (ints, slices with step 1, None, Ellipsis) as the aten views it
    amounts to."""
    key = key if isinstance(key, tuple) else (key,)
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (t.dim() - sum(k is not None for k in key) + 1) + key[i
                                                                                               + 1:]
    dim = 0
    for k in key:
        if k is None:
            t, dim = aten.unsqueeze(t, dim), dim + 1
        elif isinstance(k, slice) and k.step in (None, 1):
            t, dim = aten.slice(t, dim, k.start, k.stop), dim + 1
        elif isinstance(k, int):
            t = aten.select(t, dim, k)
        else:
            raise TypeError(f'index: {k!r} is not basic indexing')
    return t


def cuda_sdpa_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """The kernel CUDA's F.scaled_dot_product_attention picks for these inputs on an sm_80+ GPU: the
    rules of torch's sdp_utils.cpp that these calls meet. FlashAttention-2 (or cuDNN's kernel, which
    takes the same inputs and which newer cuDNN releases put first on an H100): fp16/bf16, no mask,
    head_dim <= 256, and K/V with as many heads as q or, with enable_gqa, a divisor of them. The
    memory-efficient kernel: float32 too, but equal head counts (the groups it does not read;
    attention_kernels.needs_repeated_kv). Else the math kernel, with its T x T matrix."""
    heads_ok = k.size(1) == q.size(1) or (enable_gqa and q.size(1) % k.size(1) == 0)
    if (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and q.size(-1) <= 256
        and heads_ok
            and not (is_causal and q.size(2) != k.size(2))):
        return 'flash'
    if k.size(1) == q.size(1) and q.size(-1) % 4 == 0:
        return 'efficient'
    return 'math'


class FakeCuda(TorchFunctionMode):
    """What a CPU-only build of torch cannot do with fake CUDA tensors, done the way a CUDA build
    does it. Indexing, Tensor.copy_ and out= arguments open a CUDA device guard in torch's Python
    bindings, which a CPU build has none of: they run as the aten ops they amount to.
    F.scaled_dot_product_attention, whose kernel choice a CPU build does not have (it runs the math
    kernel), runs the kernel cuda_sdpa_kernel names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__:
            return index(*args)
        if func is torch.Tensor.__setitem__:
            aten.copy_(index(args[0], args[1]), args[2])
            return None
        if func is torch.Tensor.copy_:
            return aten.copy_(*args, **kwargs)
        if 'out' in kwargs:
            out = kwargs.pop('out')
            return aten.copy_(out, func(*args, **kwargs))
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            kernel = cuda_sdpa_kernel(*args, **kwargs)
            causal, scale = kwargs.get('is_causal', False), kwargs.get('scale')
            if kernel == 'flash':
                return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal,
                                                                scale=scale)[0]
            if kernel == 'efficient':
                return aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0,
                                                                    causal, scale=scale)[0]
        return func(*args, **kwargs)


@contextmanager
def fake_cuda():
    """Fake CUDA tensors with bf16 autocast on: torch.autocast('cuda') switches itself off in a
    build without CUDA, so it is set directly. The KD loss's probe for float32-output bf16 GEMMs
    needs real values; an sm_80+ GPU with torch >= 2.8 (fused_kd.fp32_output_gemm) answers yes."""
    enabled, dtype = torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda')
    gemm_probe = fused_kd.fp32_output_gemm
    fused_kd.fp32_output_gemm = lambda device, dtype: device.type == 'cuda'
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), FakeCuda():
            torch.set_autocast_enabled('cuda', True)
            torch.set_autocast_dtype('cuda', torch.bfloat16)
            yield
    finally:
        torch.set_autocast_enabled('cuda', enabled)
        torch.set_autocast_dtype('cuda', dtype)
        torch.clear_autocast_cache()
        fused_kd.fp32_output_gemm = gemm_probe


class Trace(TorchDispatchMode):
    """Every aten op run inside: (op, input tensors, output tensors)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = lambda tree: [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
        self.ops.append((func, tensors((args, kwargs)), tensors(out)))
        return out

    def gemms(self):
        return [(func, inputs, outputs) for func, inputs, outputs in self.ops
                if func.overloadpacket in GEMMS]

    def attention(self):
        return [(func.overloadpacket, inputs) for func, inputs, _ in self.ops
                if func.overloadpacket in FUSED_ATTENTION]

    def attention_matrices(self, T, n_head):
        """The ops with a (..., T, T) output of at least n_head T x T matrices: one sequence's
        attention weights. (Fewer are no such thing: at the 1B shape, n_embd = T, a micro-batch's
        hidden states are 4 x 2048 x 2048.)"""
        return [(func, tuple(t.shape)) for func, _, outputs in self.ops for t in outputs
                if tuple(t.shape[-2:]) == (T, T) and t.numel() >= n_head * T * T]


def cuda_gpt(config, dtype=torch.float32):
    """A fake GPT on CUDA with its parameters frozen: a CUDA tensor that requires grad aborts the
    process (not an exception) when autograd records it in a CPU-only build."""
    return memory_measure.fake_gpt(config, 'cuda', dtype).requires_grad_(False)


def shapes(row, attention):
    """(the student's ModelConfig with this attention, the teacher's, 'ddp' or 'fsdp') of a paper
    row."""
    student, teacher, parallel = ROWS[row]
    return (ModelConfig(**MODEL_SHAPES[student] | dict(attention=attention)),
            ModelConfig(**MODEL_SHAPES[teacher]), parallel)


def forward(model, T):
    """model's no-grad forward of MICRO_BATCH sequences of T tokens, traced: (hidden states,
    Trace)."""
    idx = torch.randint(0, model.config.vocab_size, (MICRO_BATCH, T), device='cuda')
    with Trace() as trace, torch.no_grad():
        hidden, _ = model(idx, return_hidden=True)
    return hidden, trace


def assert_bf16_gemms(trace):
    gemms = trace.gemms()
    assert gemms and all(t.dtype == torch.bfloat16 for _, inputs, outputs in gemms for t in inputs
                         + outputs), \
        {(str(func), tuple(t.dtype for t in inputs + outputs)) for func, inputs, outputs in gemms}


@pytest.mark.parametrize('attention', ATTENTIONS)
@pytest.mark.parametrize('row', ROWS)
def test_student_forward_on_cuda_in_bf16_on_fused_kernels(row, attention):
    """The student's forward as train.py runs it on GPUs, at the real shape and T = 2,048: bf16
    autocast over float32 weights (DDP) or bf16 weights (what FSDP2's mixed precision gathers).
    Every GEMM takes and gives bf16; every layer's attention is one FlashAttention-2 call with q at
    n_head and K/V at n_kv_head, in bf16 (GQA read by the kernel, not repeated); no (..., T, T)
    tensor; alpha_ma float32."""
    cfg, _, parallel = shapes(row, attention)
    T = cfg.block_size
    with fake_cuda():
        model = cuda_gpt(cfg, torch.bfloat16 if parallel == 'fsdp' else torch.float32)
        _, trace = forward(model, T)
    assert_bf16_gemms(trace)
    calls = trace.attention()
    assert [op for op, _ in calls] == [aten._scaled_dot_product_flash_attention] * cfg.n_layer
    for _, (q, k, v, *_) in calls:
        assert q.shape == (MICRO_BATCH, cfg.n_head, T, cfg.head_dim) and q.dtype == torch.bfloat16
        assert k.shape == v.shape == (MICRO_BATCH, cfg.n_kv_head, T,
                                      cfg.head_dim) and k.dtype == v.dtype == q.dtype
    assert not trace.attention_matrices(T, cfg.n_head)
    alpha_ma = [t.dtype for name, t in model.named_buffers() if name.endswith('alpha_ma')]
    assert alpha_ma == [torch.float32] * (cfg.n_layer if cfg.variant.alpha else 0)


@pytest.mark.parametrize('attention', ATTENTIONS)
def test_float32_on_cuda_repeats_kv_for_the_memory_efficient_kernel(attention):
    """dtype=float32 on a GPU: the memory-efficient kernel (flash needs half precision) with K/V
    repeated to n_head heads, since it reads no groups: grouped, SDPA would fall back to the math
    kernel's T x T matrix. The sink's LSE op is that kernel too."""
    cfg, _, _ = shapes('1B', attention)
    T = cfg.block_size
    with fake_cuda():
        torch.set_autocast_enabled('cuda', False)
        _, trace = forward(cuda_gpt(cfg), T)
    calls = trace.attention()
    assert [op for op, _ in calls] == [aten._scaled_dot_product_efficient_attention] * cfg.n_layer
    for _, (q, k, v, *_) in calls:
        assert q.shape == k.shape == v.shape == (MICRO_BATCH, cfg.n_head, T,
                                                 cfg.head_dim) and q.dtype == torch.float32
    assert not trace.attention_matrices(T, cfg.n_head)


@pytest.mark.parametrize('row', ROWS)
def test_teacher_forward_on_cuda_in_bf16(row):
    """The KD teacher as train.py loads it on GPUs (bf16 weights, eval mode, no grad, bf16
    autocast), at its real shape: bf16 GEMMs, FlashAttention-2 with K/V at n_kv_head, no (..., T, T)
    tensor."""
    _, cfg, _ = shapes(row, 'softmax')
    T = cfg.block_size
    with fake_cuda():
        teacher = cuda_gpt(cfg, torch.bfloat16).eval()
        hidden, trace = forward(teacher, T)
    assert hidden.dtype == torch.bfloat16
    assert_bf16_gemms(trace)
    assert [(op, k.size(1)) for op, (q, k, *_) in trace.attention()] == \
           [(aten._scaled_dot_product_flash_attention, cfg.n_kv_head)] * cfg.n_layer
    assert not trace.attention_matrices(T, cfg.n_head)


@pytest.mark.parametrize('row', ROWS)
def test_kd_loss_on_cuda_runs_bf16_gemms_with_float32_outputs(row):
    """fused_kd.FusedKDLoss's forward on a micro-batch (4 x 2,048 tokens, V = 128,256) as train.py
    feeds it on GPUs: student hidden states and lm_head float32 under DDP, bf16 under FSDP; the bf16
    teacher's. It computes the loss's gradients too (autograd cannot run on fake CUDA tensors, so it
    is called as autograd would call it, asked for both gradients). Its four GEMMs per chunk take
    bf16 and give float32 from their float32 accumulators (the logits, and the gradients w.r.t. the
    hidden states and the lm_head); no chunk holds more than CHUNK_LOGITS logits."""
    student, teacher, parallel = shapes(row, 'softmax')
    N, V = MICRO_BATCH * student.block_size, student.vocab_size
    chunk = fused_kd.CHUNK_LOGITS // V  # tokens per chunk, fused_kd_loss's default
    side = torch.bfloat16 if parallel == 'fsdp' else torch.float32
    with fake_cuda():
        h_s, w_s = (torch.empty(N, student.n_embd, device='cuda', dtype=side),
                    torch.empty(V, student.n_embd, device='cuda', dtype=side))
        h_t, w_t = (torch.empty(n, teacher.n_embd, device='cuda', dtype=torch.bfloat16)
                    for n in (N, V))
        targets = torch.zeros(N, device='cuda', dtype=torch.long)
        ctx = SimpleNamespace(needs_input_grad=(True, True) + (False,) * 6,
                              save_for_backward=lambda *t: None,
                              mark_non_differentiable=lambda *t: None)
        with Trace() as trace:
            loss, _, _ = fused_kd.FusedKDLoss.forward(ctx, h_s, w_s, h_t, w_t, targets, 1.0, 1.0,
                                                     chunk)
    assert loss.dtype == torch.float32
    gemms = trace.gemms()
    assert len(gemms) == 4 * -(-N // chunk)
    for func, (*_, a, b), (out,) in gemms:  # mm(a, b) or addmm(acc, a, b)
        # w.r.t. the hidden states: their dtype
        hidden_grad = out.shape[0] <= chunk and out.shape[1] == student.n_embd
        assert (a.dtype, b.dtype, out.dtype) == (torch.bfloat16, torch.bfloat16,
                                                 side if hidden_grad else torch.float32), func
    logits = [t.numel() for _, _, outputs in trace.ops for t in outputs
              # logits, softmaxes and their gradients
              if t.dtype == torch.float32 and t.shape[-1:] == (V,)]
    assert logits and max(logits) <= fused_kd.CHUNK_LOGITS


# -----------------------------------------------------------------------------
# The dry run's memory plan against a measurement


@pytest.mark.parametrize('config', ['affine_1b', 'affine_3b'])
def test_memory_plan_is_the_dry_runs(config, capsys):
    """memory_plan.memory_plan, the plan held to measurements here and written into the docs' tables
    by tools/memory_tables.py, is what train.py --dry_run prints, component by component."""
    train.main([f'config/{config}.py', '--dry_run=True'])
    printed = dict(re.findall(r'^  (\w+) +([\d.]+) GiB', capsys.readouterr().out, re.M))
    c = runs.run_config(train.load_config([f'config/{config}.py']))
    plan = memory_plan.memory_plan(c, *memory_plan.planned_models(c))
    assert printed == {key: f'{n / 2**30:.2f}' for key,
                       n in (plan | dict(total=sum(plan.values()))).items()}


# (affine_gated_1b: softmax_1b's shape with every module a variant adds; affine_3b: FSDP; softmax_1b
# left out for the suite's time, its plan the same code on fewer modules)
@pytest.mark.parametrize('config', ['affine_gated_1b', 'affine_3b'])
def test_memory_plan_holds_against_a_fake_tensor_measurement(config):
    """--dry_run's per-GPU plan for a paper row (1B: DDP; 3B: FSDP on 8 GPUs; micro-batch 4 x 2,048
    tokens, KD from the published teacher's shape) against the peak MemTracker measures in a
    training micro-step on fake tensors (memory_measure.fake_peak_memory). Measured with 1 and 2
    student layers and 1 and 2 teacher layers, every layer of the real shape, and extrapolated,
    every decoder layer (the student's or the teacher's) adding the same: peak(n_layer,
    n_teacher) = peak(1, 1) + (n_layer - 1) student steps + (n_teacher - 1) teacher steps. The
    teacher measured whole (28 or 32 layers, most of the measuring time) gave the same peaks to
    the byte at 1 and 2 student layers (1B and 3B); tools/memory_tables.py --measure=True
    measures full depth, where the student's extrapolation was exact to 0.01 GiB (1B and 3B).
    The plan's per-layer steps are the measured ones within 2%, and its total is conservative by
    at most 10%: the margin for what it leaves out (the CUDA context, NCCL, fragmentation) is the
    dry run's verdict's, not the plan's."""
    c = runs.run_config(train.load_config([f'config/{config}.py']))
    student, teacher = memory_plan.planned_models(c)
    plan, peak = {}, {}
    for depths in ((1, 1), (2, 1), (1, 2)):
        shallow = (dataclasses.replace(student, n_layer=depths[0]),
                   dataclasses.replace(teacher, n_layer=depths[1]))
        plan[depths] = sum(memory_plan.memory_plan(c, *shallow).values())
        peak[depths] = memory_measure.fake_peak_memory(c, *shallow)
    step = {model: (peak[deeper] - peak[1, 1], plan[deeper] - plan[1, 1])
            for model, deeper in (('student', (2, 1)), ('teacher', (1, 2)))}
    for model, (measured, planned) in step.items():
        assert planned == pytest.approx(measured, rel=0.02), model
    full = (peak[1, 1] + (student.n_layer - 1) * step['student'][0]
            + (teacher.n_layer - 1) * step['teacher'][0])
    planned = sum(memory_plan.memory_plan(c, student, teacher).values())
    assert full <= planned <= 1.10 * full, (
        f'plan {planned / 2**30:.2f} GiB, measured {full / 2**30:.2f} GiB')


# -----------------------------------------------------------------------------
# Compiled training and evaluation under DDP and FSDP


# 9 layers, one more than dynamo's recompile limit: a layer that recompiled would run eager from the
# 9th on. 2.4 MB of weights per layer: over the 1 MiB of DDP's first bucket, where dynamo's DDP
# graph splitting would cut each layer
COMPILED = ['--n_layer=9', '--n_head=4', '--n_kv_head=2', '--n_embd=256', '--intermediate_size=512',
            '--vocab_size=320',
            '--block_size=32', '--global_batch_size=8', '--micro_batch_size=2', '--eval_batches=3',
            '--device=cpu', '--dtype=float32', '--peak_flops=1e12']
TEACHER = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=128,
                      vocab_size=320, block_size=32)


def compiled_run(rank, world, data_dir, parallel, attention):
    """train.py's compiled path for one variant on this rank (2 micro-steps of 2 sequences per step,
    KD from a compiled teacher), its decoder layers compiled by distributed.compile_layers with
    dynamo's aot_eager backend: the graphs dynamo compiles and the graph breaks, in each phase of a
    run's start: a first micro-step (under DDP a no_sync one), three optimizer steps as train.py's
    loop takes them, train.evaluation_record after the second and the third. Also, under DDP, how
    many gradients the first micro-step made beside DDP's buckets
    (gpu_check.ddp_gradient_copies)."""
    # each variant from scratch: graphs kept from the last one count towards the recompile limit
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    c = train.load_config(COMPILED + [f'--data_dir={data_dir}', f'--attention={attention}'])
    # 8 = 2 x 2 x 2
    run = train.Run(rank, world, torch.device('cpu'), True, parallel == 'ddp', 2, nullcontext())
    torch.manual_seed(0)
    raw = GPT(ModelConfig(**{k: c[k] for k in FIELD_NAMES}))
    distributed.compile_layers(raw, backend)
    if parallel == 'fsdp':
        distributed.apply_fsdp(raw, c['dtype'])
    optimizer = train.configure_optimizers(raw, c['weight_decay'], c['learning_rate'],
                                           (c['beta1'], c['beta2']))
    model = distributed.wrap_ddp(raw, run.device) if run.ddp else raw
    teacher = distributed.compile_layers(GPT(TEACHER).eval().requires_grad_(False), backend)
    train_data, val_data = (Windows(data_dir, split, c['block_size']) for split in ('train', 'val'))
    phases, copies = {}, None

    def phase(name, fn):
        before = len(graphs), sum(counters['graph_break'].values())
        out = fn()
        phases[name] = len(graphs) - before[0], sum(counters['graph_break'].values()) - before[1]
        return out

    # as in train.py's loop: forward and loss, backward (DDP: all-reduced if last)
    def micro_step(indices, last):
        x, y = distributed.batch_to_device(train_data.get(indices), run.device)
        with model.no_sync() if run.ddp and not last else nullcontext():
            with run.autocast:
                loss = train.compute_loss(model, raw, teacher, x, y,
                                          teacher_timer=measure.DeviceTimer(run.device))[0]
            (loss / run.accumulation).backward()

    # as in train.py's loop: this rank's micro-steps, clipping, AdamW, alpha_ma
    def optimizer_step(step):
        mine = train_data.step_indices(c['seed'], step,
                                       c['global_batch_size'])[rank * run.accumulation * 2:]
        for micro in range(run.accumulation):
            micro_step(mine[micro * 2:(micro + 1) * 2], last=micro == run.accumulation - 1)
        distributed.full_tensor(torch.nn.utils.clip_grad_norm_(raw.parameters(),
                                                               c['grad_clip'])).item()
        optimizer.step()
        alpha_means = raw.update_alpha_ma()
        optimizer.zero_grad(set_to_none=not run.ddp)
        return alpha_means

    phase('first micro-step', lambda: micro_step(range(rank * 2, rank * 2 + 2), last=not run.ddp))
    if run.ddp:
        copies = gpu_check.ddp_gradient_copies(model)
    optimizer.zero_grad(set_to_none=not run.ddp)
    for step in range(3):
        alpha_means = phase(f'step {step + 1}', lambda: optimizer_step(step))
        if step:
            phase('evaluation '
                  f'{step}',
                  lambda: train.evaluation_record(c, run, model, raw, val_data, alpha_means))
    return phases, copies


def _compiled_worker(rank, world, init_file, result_file, data_dir, variants):
    torch.set_num_threads(1)  # a core each
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank, world_size=world)
    try:
        results = {parallel: {attention: compiled_run(rank, world, data_dir, parallel, attention)
                              for attention in attentions}
                   for parallel, attentions in variants.items()}
        torch.save(results, f'{result_file}.{rank}')
    finally:
        dist.destroy_process_group()


# Under FSDP the variants with parameters of their own (sharded with their layers: sink, whose
# kernel softmax1 runs with zero logits, and affine_gated, which holds affine's and gated's code),
# under DDP, whose graph splitting does not depend on the attention, softmax: every variant's code
# once, for the suite's time
COMPILED_VARIANTS = {'ddp': ('softmax',), 'fsdp': ('sink', 'affine_gated')}


@pytest.fixture(scope='module')
def compiled_results(data_dir, tmp_path_factory):
    """[rank 0's, rank 1's] {'ddp' or 'fsdp': {attention: compiled_run's (phases, copies)}}: every
    run of COMPILED_VARIANTS from one start of the 2 gloo ranks (a start is two processes importing
    torch and dynamo: tens of seconds on a loaded CPU)."""
    tmp = tmp_path_factory.mktemp('compiled')
    torch.multiprocessing.spawn(_compiled_worker,
                                args=(2, str(tmp / 'init'), str(tmp / 'result'), data_dir,
                                      COMPILED_VARIANTS), nprocs=2, join=True)
    return [torch.load(tmp / f'result.{rank}', weights_only=False) for rank in range(2)]


@pytest.mark.xdist_group('compiled_results')  # its module fixture, built once
@pytest.mark.parametrize('parallel', ['ddp', 'fsdp'])
def test_compiled_training_and_evaluation_never_recompile(compiled_results, parallel):
    """COMPILED_VARIANTS, 9 layers, 2 gloo ranks, as train.py runs them compiled: the student's
    layers compile once for training and the teacher's once (the first micro-step), the student's
    once more for evaluation's eval mode (the first evaluation), and nothing else compiles, on any
    rank: no recompilation in later steps or evaluations (the attention-logit statistics' hooks run
    eagerly: traced, they made every layer recompile at every evaluation). No graph breaks. Under
    DDP one graph per layer, not DDP's bucket-sized pieces (distributed.compile_layers turns
    dynamo's DDP graph splitting off), and no gradient beside DDP's buckets after a no_sync
    micro-step."""
    expected = {'first micro-step': (2, 0), 'step 1': (0, 0), 'step 2': (0, 0),
                'evaluation 1': (1, 0), 'step 3': (0, 0), 'evaluation 2': (0, 0)}
    for rank, results in enumerate(compiled_results):
        assert tuple(results) == tuple(COMPILED_VARIANTS)
        assert tuple(results[parallel]) == COMPILED_VARIANTS[parallel]
        for attention, (phases, copies) in results[parallel].items():
            assert phases == expected, (rank, attention)
            assert copies == (0 if parallel == 'ddp' else None), (rank, attention)
