"""Tests for distill.py: this repo's checkpoints and Hugging Face directories as teachers, the fused
KD loss against a float64 full-logits reference, a short distillation run, every compatibility
error, Mistral and other-family teachers, the CLI. (GPT.from_pretrained itself is tested in
test_checkpoint.py; the tiny Hugging Face checkpoints these tests share are the fixtures hf_dirs and
family_teachers of conftest.py.)"""
import dataclasses
import json
import math
import re
import shutil
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import distill
from lmkit import memory_plan
import prepare_data as prep
import train
from lmkit.data import read_meta
from prepare_data import read_shard
from lmkit.data_meta import tokenizer_files
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from lmkit.errors import RunError, run_script
from model import GPT, ModelConfig
from helpers import EOT
from hf_helpers import hf_logits, rel_err

torch.set_num_threads(2)


# -----------------------------------------------------------------------------
# This repo's checkpoints as teachers


BYTES = tokenizer_info(load_tokenizer('bytes'), 'bytes')


def tiny_config(**kw):
    return ModelConfig(**dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=96,
                              vocab_size=320, block_size=64, tie_embeddings=True) | kw)


def save_our_checkpoint(model, path, prefix=''):
    """What train.py writes (the contract): state dict, asdict(ModelConfig), the data's tokenizer,
    and training state that is not plain tensors (numpy's RNG state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(model={prefix + k: v for k, v in model.state_dict().items()},
                    model_config=dataclasses.asdict(model.config), tokenizer=BYTES, step=7,
                    optimizer={'state': {}},
                    rng=dict(numpy=np.random.get_state(), torch=torch.get_rng_state()),
                    config={'teacher': None}), path)


@pytest.fixture(scope='module')
def our_teacher(tmp_path_factory):
    """An affine teacher with a non-zero alpha_ma, saved from a compiled model (_orig_mod.
    prefixes). Its (tied) embeddings are large, so its predictions are peaked and depend mostly on
    the current token: a student can learn them in a few steps."""
    torch.manual_seed(0)
    model = GPT(tiny_config(attention='affine'))
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 0.3)
        for layer in model.model.layers:
            layer.self_attn.alpha_ma.uniform_(0.2, 0.8)
    path = tmp_path_factory.mktemp('ours') / 'teacher' / 'ckpt.pt'
    save_our_checkpoint(model, path, prefix='_orig_mod.')
    # train.py writes its run config next to ckpt.pt
    (path.parent / 'config.json').write_text('{"n_layer": 2}')
    return model.eval(), path


def test_load_teacher_from_our_checkpoint(our_teacher):
    model, path = our_teacher
    idx = torch.randint(0, 320, (2, 32))
    with torch.no_grad():
        expected = model(idx)[0]
    for spec in (str(path), str(path.parent)):  # the file, or the directory holding it
        teacher = distill.load_teacher(spec)
        assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
        assert teacher.config == model.config
        with torch.no_grad():
            assert torch.equal(teacher(idx)[0], expected)
        assert distill.teacher_tokenizer_info(spec)['sha256'] == BYTES['sha256']


def test_bad_teacher_specs(tmp_path):
    (tmp_path / 'empty').mkdir()
    torch.save(dict(model={}), tmp_path / 'partial.pt')
    for spec, message in [(tmp_path / 'nowhere', 'no such file or directory'),
                          (tmp_path / 'empty', 'neither config.json'),
                          (tmp_path / 'partial.pt', 'no model_config, tokenizer')]:
        with pytest.raises(RunError, match=message):
            distill.load_teacher(str(spec))

# -----------------------------------------------------------------------------
# The fused KD loss


def kd_inputs(dtype=torch.float64, B=2, T=13, C_s=16, C_t=24, V=37, seed=0):
    """Random student/teacher hidden states and lm_heads of different widths; logits of a few
    units."""
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(B, T, C_s, generator=g, dtype=dtype).requires_grad_()
    w_s = (torch.randn(V, C_s, generator=g, dtype=dtype) * 0.5).requires_grad_()
    h_t, w_t = torch.randn(B, T, C_t, generator=g, dtype=dtype), torch.randn(V, C_t, generator=g,
                                                                             dtype=dtype) * 0.7
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, :4] = targets[1, -3:] = -100  # ignored tokens, e.g. padding
    return h_s, w_s, h_t, w_t, targets


@pytest.mark.parametrize('temperature', [1.0, 2.0, 0.5])
@pytest.mark.parametrize('kd_alpha, '
                         'with_targets', [(1.0, False), (1.0, True), (0.5, True), (0.0, True)])
@pytest.mark.parametrize('chunk_size', [5, None])
def test_fused_kd_loss_equals_full_logits_float64(temperature, kd_alpha, with_targets, chunk_size):
    h_s, w_s, h_t, w_t, targets = kd_inputs()
    targets = targets if with_targets else None
    loss, kd, ce = distill.fused_kd_loss(h_s, w_s, h_t, w_t, temperature, targets, kd_alpha,
                                         chunk_size)
    ref_loss, ref_kd, ref_ce = distill.kd_loss(h_s, w_s, h_t, w_t, temperature, targets, kd_alpha)
    upstream = 1.7  # backward must scale the stored gradients by grad_output
    grads = torch.autograd.grad(upstream * loss, (h_s, w_s))
    ref_grads = torch.autograd.grad(upstream * ref_loss, (h_s, w_s))
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, **exact)
    torch.testing.assert_close(kd, ref_kd.detach(), **exact)
    assert not kd.requires_grad and (ce is None) == (targets is None)
    if ce is not None:
        torch.testing.assert_close(ce, ref_ce.detach(), **exact)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got, expected, **exact)


def test_temperature_and_ce_mix_by_hand():
    """One token, two classes: student logits (0, 0), teacher logits (0, ln 3), target class 1."""
    h = torch.ones(1, 1, dtype=torch.float64)
    w_t = torch.tensor([[0.0], [math.log(3)]], dtype=torch.float64)
    for T, alpha in [(1.0, 1.0), (2.0, 1.0), (2.0, 0.25), (3.0, 0.0)]:
        w_s = torch.zeros(2, 1, dtype=torch.float64, requires_grad=True)  # logits = w_s since h = 1
        loss, kd, ce = distill.fused_kd_loss(h, w_s, h, w_t, T, torch.tensor([1]), alpha)
        loss.backward()
        p1 = 3 ** (1 / T) / (1 + 3 ** (1 / T))  # the teacher's softened probability of class 1
        p = torch.tensor([1 - p1, p1], dtype=torch.float64)
        kl = (p * (p / 0.5).log()).sum()  # KL(p || (1/2, 1/2))
        assert kd.item() == pytest.approx(T * T * kl.item(), rel=1e-12)
        assert ce.item() == pytest.approx(math.log(2), rel=1e-12)
        assert loss.item() == pytest.approx(alpha * T * T * kl.item() + (1 - alpha) * math.log(2),
                                            rel=1e-12)
        # d/ds: alpha T (q - p) + (1 - alpha)(softmax(s) - onehot(1)), with q = softmax(s) = (1/2,
        # 1/2)
        expected = alpha * T * (0.5 - p) + (1 - alpha) * torch.tensor([0.5, -0.5],
                                                                      dtype=torch.float64)
        torch.testing.assert_close(w_s.grad[:, 0], expected, rtol=1e-12, atol=1e-12)


def test_fused_kd_loss_under_bf16_autocast_and_with_bf16_inputs():
    h_s, w_s, h_t, w_t, targets = (t.detach().float() if t.is_floating_point() else t
                                   for t in kd_inputs())
    h_s.requires_grad_(), w_s.requires_grad_()
    ref = distill.kd_loss(h_s.double(), w_s.double(), h_t.double(), w_t.double(), 2.0, targets,
                          0.5)[0]
    # under autocast the vocabulary matmuls run in bf16 (the logits carry its 2^-9 rounding,
    # measured <= 2e-4 of the loss), the log-softmax and the sums in float32: a float32 loss within
    # bf16 rounding of the float64 one
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss, _, _ = distill.fused_kd_loss(h_s, w_s, h_t, w_t, 2.0, targets, 0.5)
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 1e-3 * ref.item()
    # bf16 hidden states and teacher head (a bf16 teacher, autocast student): float32 loss, grads in
    # input dtypes
    h_bf = h_s.detach().bfloat16().requires_grad_()
    loss, _, _ = distill.fused_kd_loss(h_bf, w_s, h_t.bfloat16(), w_t.bfloat16(), 2.0, targets, 0.5)
    loss.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 0.05 * ref.item()
    assert h_bf.grad.dtype == torch.bfloat16 and w_s.grad.dtype == torch.float32


def test_fused_kd_loss_without_grad_and_bad_arguments():
    h_s, w_s, h_t, w_t, targets = kd_inputs()
    with torch.no_grad():
        loss, kd, ce = distill.fused_kd_loss(h_s, w_s, h_t, w_t, targets=targets)
    assert not loss.requires_grad and loss.item() == pytest.approx(distill.kd_loss(
        h_s, w_s, h_t, w_t, 1.0, targets, 1.0)[0].item(), rel=1e-12)
    for kwargs, message in [(dict(teacher_weight=w_t[:-1]), 'rows'),
                            (dict(temperature=0.0), 'temperature > 0'),
                            (dict(kd_alpha=0.5),
                             'targets when kd_alpha < 1'), (dict(kd_alpha=1.5), 'kd_alpha <= 1'),
                            (dict(teacher_hidden=h_t[:, :-1]), 'differ in tokens')]:
        args = dict(student_hidden=h_s, student_weight=w_s, teacher_hidden=h_t,
                    teacher_weight=w_t) | kwargs
        with pytest.raises(ValueError, match=message):
            distill.fused_kd_loss(**args)


def test_short_distillation_run_brings_student_to_teacher(our_teacher):
    """train.py's KD step on a tiny scale: the student's KL to this repo's (affine) teacher
    falls."""
    _, path = our_teacher
    teacher = distill.load_teacher(str(path))
    torch.manual_seed(1)
    student = GPT(tiny_config(attention='softmax'))
    opt = train.configure_optimizers(student, weight_decay=0.0, lr=1e-2, betas=(0.9, 0.95),
                                     fused=False)
    held_out = torch.randint(0, 257, (4, 32))

    def kl(idx):
        with torch.no_grad():
            h_s, _ = student(idx, return_hidden=True)
            h_t, _ = teacher(idx, return_hidden=True)
            return distill.fused_kd_loss(h_s, student.lm_head.weight, h_t,
                                         teacher.lm_head.weight)[1].item()

    before = kl(held_out)
    for _ in range(30):
        idx = torch.randint(0, 257, (8, 32))
        h_s, _ = student(idx, return_hidden=True)
        with torch.no_grad():
            h_t, _ = teacher(idx, return_hidden=True)
        loss, _, ce = distill.fused_kd_loss(h_s, student.lm_head.weight, h_t,
                                            teacher.lm_head.weight, targets=idx.roll(-1, 1))
        assert torch.isfinite(ce)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = kl(held_out)
    print(f"held-out KL(teacher || student): {before:.3f} -> {after:.3f}")
    assert after < 0.1 * before

# -----------------------------------------------------------------------------
# The fused KD loss in training precision, and the memory it needs


def norm_err(got, expected):
    return ((got.double() - expected).norm() / expected.norm()).item()


# name: (bf16 autocast, the student's hidden states, the teacher's hidden states and lm_head)
PRECISIONS = {
    # (the student's lm_head is a float32 master weight in all)
    'float32': (False, torch.float32, torch.float32),
    'float64': (False, torch.float64, torch.float64),
    # train.py's bf16 run: autocast, the student's float32 residual stream, a teacher loaded in bf16
    'bf16 autocast': (True, torch.float32, torch.bfloat16),
    # bf16 hidden states (FSDP)
    'bf16 autocast, bf16 hidden': (True, torch.bfloat16, torch.bfloat16),
}


def training_inputs(precision, B=2, T=40, C_s=64, C_t=96, V=300, seed=0):
    """h_s, w_s, h_t, w_t, targets in a PRECISIONS setting; logits of std ~1.5 (|s| up to ~7), some
    ignored targets."""
    _, hidden, teacher = PRECISIONS[precision]
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(B, T, C_s, generator=g, dtype=torch.float64).to(hidden).requires_grad_()
    w_s = (torch.randn(V, C_s, generator=g, dtype=torch.float64) * 1.5 / C_s ** 0.5)
    w_s = w_s.to(torch.float64 if hidden == torch.float64 else torch.float32).requires_grad_()
    h_t = torch.randn(B, T, C_t, generator=g, dtype=torch.float64).to(teacher)
    w_t = (torch.randn(V, C_t, generator=g, dtype=torch.float64) * 2.0 / C_t ** 0.5).to(teacher)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, :5] = targets[1, -3:] = -100
    return h_s, w_s, h_t, w_t, targets


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason='needs CUDA (tools/gpu_check.py runs it on a GPU machine)'))])
@pytest.mark.parametrize('precision', ['float32', 'bf16 autocast', 'bf16 autocast, bf16 hidden'])
@pytest.mark.parametrize('temperature, kd_alpha', [(1.0, 1.0), (2.0, 1.0), (0.5, 0.3), (2.0, 0.5)])
def test_fused_kd_loss_in_training_precision_against_float64(precision, temperature, kd_alpha,
                                                             device):
    h_s, w_s, h_t, w_t, targets = (t.detach().to(device) for t in training_inputs(precision))
    h_s.requires_grad_(), w_s.requires_grad_()
    # the reference: the full logits in float64 on the CPU, from the very values the fused loss is
    # given
    ref_h = h_s.detach().cpu().double().requires_grad_()
    ref_w = w_s.detach().cpu().double().requires_grad_()
    ref = distill.kd_loss(ref_h, ref_w, h_t.cpu().double(), w_t.cpu().double(), temperature,
                          targets.cpu(), kd_alpha)
    ref_grads = torch.autograd.grad(ref[0], (ref_h, ref_w))
    with torch.autocast(device, dtype=torch.bfloat16, enabled=PRECISIONS[precision][0]):
        loss, kd, ce = distill.fused_kd_loss(h_s, w_s, h_t, w_t, temperature, targets, kd_alpha,
                                             chunk_size=24)
    grads = [g.cpu() for g in torch.autograd.grad(loss, (h_s, w_s))]
    assert loss.dtype == kd.dtype == ce.dtype == torch.float32
    # grad_h as h; the lm_head's float32
    assert grads[0].dtype == h_s.dtype and grads[1].dtype == torch.float32
    if precision == 'float32':
        # float32 rounds by 2^-24 per operation, accumulated over C-term dot products and V-term
        # sums: measured <= 2e-7 (values) and <= 1e-6 (gradients, relative in norm); 5-10x margins
        value_tol, grad_tol = 1e-6, 1e-5
    else:
        # bf16 keeps 8 significant bits (rounding 2^-9 = 0.2%): the GEMMs' operands are rounded, and
        # on CPU (no float32-output GEMM) the logits too, by up to 2^-9 |s| ~ 0.01, which is q's
        # relative error. The values average such errors over tokens (measured <= 2e-4 relative),
        # the gradients carry them entry by entry and are rounded to bf16 once more for their GEMMs
        # (measured <= 8e-3 in norm): 5x and 2.5x margins. A mistake in the formulas (a T, a
        # kd_alpha, an ignored token, the 1/count) is an O(1) error, far above these.
        value_tol, grad_tol = 1e-3, 2e-2
    for name, got, expected in zip(('loss', 'kd', 'ce'), (loss, kd, ce), ref):
        assert abs(got.item() / expected.item() - 1) < value_tol, name
    for name, got, expected in zip(('hidden', 'lm_head'), grads, ref_grads):
        assert norm_err(got, expected) < grad_tol, name


class Allocations(TorchDispatchMode):
    """What the ops run under it allocate, from the tensors they return: bytes live now and at the
    peak, each new allocation as (op, shape, dtype), and each op as (name, its input tensors'
    dtypes). A returned tensor's storage is new unless one of the op's inputs has it (a view, an
    in-place result) or it is counted already; it is uncounted when it is freed (weakref.finalize on
    the storage: PyTorch keeps one Python object per storage, alive as long as the storage). Tensors
    made before the mode (the inputs) are not counted, kernels' workspaces not seen."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.counted, self.allocations, self.ops = set(), [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        self.ops.append((name, [t.dtype for t in inputs]))
        out = func(*args, **(kwargs or {}))
        known = {t.untyped_storage()._cdata for t in inputs}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage._cdata, storage.nbytes()
                if key not in known and key not in self.counted and nbytes:
                    self.counted.add(key)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    self.allocations.append((name, tuple(t.shape), t.dtype))
                    weakref.finalize(storage, self._free, key, nbytes)
        return out

    def _free(self, key, nbytes):
        self.counted.discard(key)
        self.live -= nbytes


def test_allocations_counts_storages_once_and_until_freed():
    x = torch.zeros(10)  # made before: not counted
    with Allocations() as m:
        a = torch.ones(1000)  # 4,000 bytes
        b = a[1:]  # a view: nothing new
        b.mul_(2)  # in place: nothing new
        c = a * 2  # 4,000 more
        x.view(2, 5).add_(1)
        del a
        assert m.live == 8000  # a's storage lives on in b
        del b
        assert m.live == 4000 and m.peak == 8000
        del c
    assert m.live == 0 and m.peak == 8000 and [shape for _, shape, _ in m.allocations] == [(1000,),
                                                                                           (1000,)]


@pytest.mark.parametrize('precision', PRECISIONS)
def test_fused_kd_loss_gemms_run_in_the_compute_dtype(precision):
    """The four GEMMs per chunk (teacher and student logits, the gradients w.r.t. the hidden states
    and the lm_head) take operands in the autocast dtype under autocast, else in the inputs'
    dtype."""
    h_s, w_s, h_t, w_t, targets = training_inputs(precision)
    autocast, hidden, _ = PRECISIONS[precision]
    with Allocations() as m:
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            loss = distill.fused_kd_loss(h_s, w_s, h_t, w_t, 2.0, targets, 0.5, chunk_size=24)[0]
        loss.backward()
    compute = torch.bfloat16 if autocast else hidden
    # (the two matrices)
    gemms = [dtypes[-2:] for name, dtypes in m.ops if name in ('mm', 'addmm', 'addmm_')]
    # 80 tokens: 4 chunks
    assert len(gemms) == 4 * 4 and all(dtypes == [compute, compute] for dtypes in gemms), gemms


@pytest.mark.parametrize('temperature, kd_alpha, '
                         'log_softmaxes', [(1.0, 1.0, 2), (2.0, 1.0, 2), (1.0, 0.5, 2),
                                                                  (2.0, 0.5, 3)])
def test_ce_gets_its_own_log_softmax_only_for_its_gradient(temperature, kd_alpha, log_softmaxes):
    """(n, V) log-softmaxes per chunk: the teacher's and the student's (at T) always. A CE that is
    only logged (kd_alpha = 1) is logsumexp(s) - s[y]; at T = 1 CE reads log q; only a CE in the
    gradient at T != 1 needs softmax(s) besides softmax(s / T)."""
    h_s, w_s, h_t, w_t, targets = training_inputs('float32')
    with Allocations() as m:
        distill.fused_kd_loss(h_s, w_s, h_t, w_t, temperature, targets, kd_alpha,
                              chunk_size=40)[0].backward()
    # 80 tokens: 2 chunks
    assert sum(name == '_log_softmax' for name, _ in m.ops) == 2 * log_softmaxes


# name: (bf16 autocast, the student's hidden states, the teacher's inputs, temperature, kd_alpha)
MEMORY_CASES = {
    'float32': (False, torch.float32, torch.float32, 1.0, 1.0),
    'float32, T=2, kd_alpha=0.5': (False, torch.float32, torch.float32, 2.0, 0.5),
    'bf16 autocast': (True, torch.float32, torch.bfloat16, 1.0, 1.0),  # train.py's bf16 run
    'bf16 autocast, bf16 hidden, T=0.5, '
    'kd_alpha=0.3': (True, torch.bfloat16, torch.bfloat16, 0.5, 0.3),
    # its head must be cast
    'bf16 autocast, float32 teacher': (True, torch.float32, torch.float32, 2.0, 1.0),
}


@pytest.mark.parametrize('case', MEMORY_CASES)
def test_kd_loss_memory_bounds_what_fused_kd_loss_allocates(case):
    """memory_plan.kd_loss_memory against the bytes fused_kd_loss's forward + backward really
    allocate on CPU (Allocations), chunked, with ignored targets. Also: no copy of a teacher lm_head
    already in the compute dtype, the student's lm_head cast once per call (not per chunk), and its
    float32 gradient handed to .grad as made."""
    autocast, hidden, teacher, T, kd_alpha = MEMORY_CASES[case]
    # 4 chunks whose (n, V) float32 tensors are 1 MB each
    N, V, C_s, C_t, chunk = 256, 4000, 48, 80, 64
    g = torch.Generator().manual_seed(0)
    h_s = torch.randn(N, C_s, generator=g).to(hidden).requires_grad_()
    w_s = (torch.randn(V, C_s, generator=g) * 0.2).requires_grad_()
    h_t, w_t = torch.randn(N, C_t,
                           generator=g).to(teacher), (torch.randn(V, C_t,
                                                                  generator=g) * 0.2).to(teacher)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:10] = -100
    with Allocations() as m:
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            loss, kd, ce = distill.fused_kd_loss(h_s, w_s, h_t, w_t, T, targets, kd_alpha, chunk)
        loss.backward()
    compute = torch.bfloat16 if autocast else torch.float32
    estimate = memory_plan.kd_loss_memory(N, V, C_s, C_t, compute,
                                          student_weight_dtype=torch.float32,
                                          teacher_weight_dtype=teacher, hidden_dtype=hidden,
                                          temperature=T,
                                          kd_alpha=kd_alpha, device_type='cpu', chunk_size=chunk)
    print(f"{case}: measured peak {m.peak:,} bytes, kd_loss_memory {estimate:,} "
          f"({estimate / m.peak:.3f}x)")
    # an upper bound, and a tight one: its only slack is the allowance for (n,)-sized vectors and
    # scalars (~1% here)
    assert m.peak <= estimate <= 1.1 * m.peak
    assert [a for a in m.allocations
            if a[1] == (V, C_t)] == ([('_to_copy', (V, C_t), torch.bfloat16)]
                                     if teacher != compute else [])
    assert [a for a in m.allocations if a[0] == '_to_copy' and a[1] == (V, C_s)] == (
        [('_to_copy', (V, C_s), torch.bfloat16)] if autocast else [])
    assert [a for a in m.allocations
            if a[1:] == ((V, C_s), torch.float32)] == [('zeros', (V, C_s), torch.float32)]
    assert h_s.grad.dtype == hidden and w_s.grad.dtype == torch.float32


# -----------------------------------------------------------------------------
# Compatibility checks


def bytes_meta(**kw):
    return dict(tokenizer=BYTES, vocab_size=BYTES['n_vocab']) | kw


@pytest.mark.parametrize('case',
                         ['tokenizer', 'data vocab > teacher rows', 'data vocab > student vocab',
                          'student rows != teacher rows', 'block_size > teacher', 'everything'])
def test_compatibility_errors(case, our_teacher, hf_dirs):
    _, path = our_teacher
    teacher, spec = distill.load_teacher(str(path)), str(path)
    student, meta, block_size = tiny_config(), bytes_meta(), 64
    distill.check_compatibility(teacher, spec, student, meta, block_size)  # the good case passes
    llama_tokenizer = tokenizer_info(load_tokenizer(str(hf_dirs['llama'])), str(hf_dirs['llama']))
    if case in ('tokenizer', 'everything'):
        meta = bytes_meta(tokenizer=llama_tokenizer)
    if case == 'data vocab > teacher rows':
        # None: the teacher against the data only (the CLI)
        meta, student = bytes_meta(vocab_size=321), None
    if case in ('data vocab > student vocab', 'everything'):
        student = tiny_config(vocab_size=256)
    if case == 'student rows != teacher rows':
        student = tiny_config(vocab_size=384)
    if case in ('block_size > teacher', 'everything'):
        block_size = 65
    # one message per problem; a student smaller than the data's vocabulary also differs from the
    # teacher
    tokenizer, block = ('is not the one the data was tokenized with',
                        "block_size=65 is longer than the teacher's 64")
    small = ["student's vocab_size is 256",
             "the student has 256 vocabulary rows, the teacher 320; KD compares the two "
             "distributions row by row: set the student's vocab_size=320"]
    messages = {'tokenizer': [tokenizer],
                'data vocab > teacher rows': ["teacher's lm_head only 320 rows"],
                'data vocab > student vocab': small,
                'student rows != teacher rows': [
        'the student has 384 vocabulary rows, the teacher 320'],
                'block_size > teacher': [block], 'everything': [tokenizer, *small, block]}[case]
    with pytest.raises(RunError) as e:
        distill.check_compatibility(teacher, spec, student, meta, block_size)
    text = str(e.value)
    assert text.startswith(f'teacher {spec} does not fit') and text.count('\n  - ') == len(messages)
    assert all(m in text for m in messages), text


def prepared_tokenizer(spec):
    """The tokenizer record prepare_data.py writes for --tokenizer=spec, a directory."""
    return dict(tokenizer_info(load_tokenizer(spec), spec), files=[tokenizer_files(spec)])


def test_hf_teacher_tokenizer_is_checked(hf_dirs):
    spec = str(hf_dirs['llama'])
    teacher = distill.load_teacher(spec)
    distill.check_compatibility(teacher, spec, teacher.config,
                                dict(tokenizer=prepared_tokenizer(spec), vocab_size=512), 128)
    # data of another tokenizer, recorded before tokenizer files were, or prepared with 'bytes'
    for meta, why in [(bytes_meta(), 'an older prepare_data.py prepared it'),
                      (bytes_meta(tokenizer=dict(BYTES, files=[])),
                       'its tokenizer was not read from a directory')]:
        with pytest.raises(RunError, match=re.escape(
                "its tokenizer files are not known to build the data's tokenizer (bytes, 257 "
                f"tokens, from bytes): the data's meta.json records none ({why})")):
            distill.check_compatibility(teacher, spec, None, meta, 128)


def test_hf_teacher_is_checked_by_its_tokenizer_files(family_teachers, tmp_path):
    """A Hugging Face teacher is checked against the data by the sha256 of its tokenizer files,
    which prepare_data.py records, not by a rebuild of its tokenizer. The teacher whose tokenizer
    prepared the data is accepted. A copy with one byte more in tokenizer_config.json, and data
    prepared before the files were recorded, are refused with the remedy. Once prepare_data.py has
    run again as the remedy says, both teachers are accepted and the shards are as they were."""
    spec = str(family_teachers['smollm_llama'])
    teacher, data = distill.load_teacher(spec), tmp_path / 'data'
    prepare = ['--source=builtin', f'--out_dir={data}', '--num_proc=1', '--val_every=10',
               '--max_tokens=20000']
    prep.main([*prepare, f'--tokenizer={spec}'])
    distill.check_compatibility(teacher, spec, teacher.config, read_meta(str(data)), 16)
    copy = tmp_path / 'teacher'
    shutil.copytree(spec, copy)
    with open(copy / 'tokenizer_config.json', 'a') as f:
        f.write(' ')

    def refusal(teacher_spec):
        with pytest.raises(RunError) as e:
            distill.check_compatibility(teacher, teacher_spec, teacher.config,
                                        read_meta(str(data)), 16)
        assert str(e.value).count('\n  - ') == 1
        assert (f"if the teacher's tokenizer is the same, run prepare_data.py again on this "
                f"data_dir with --tokenizer={teacher_spec} and the same other arguments (it checks "
                "that the tokenizer is the same by its sha256, and records these files); otherwise "
                f"prepare the data with --tokenizer={teacher_spec}") in str(e.value)
        return str(e.value)

    tok = read_meta(str(data))['tokenizer']
    assert ("its tokenizer files are not known to build the data's tokenizer ("
            f"{tok['family']}, {tok['n_vocab']:,} tokens, from {spec}): tokenizer_config.json "
            "(other bytes); if") in refusal(str(copy))
    meta = json.loads((data / 'meta.json').read_text())
    del meta['tokenizer']['files']
    (data / 'meta.json').write_text(json.dumps(meta))
    assert ("the data's meta.json records none (an older prepare_data.py prepared it)"
            in refusal(spec))
    before = {p.name: p.read_bytes() for p in data.glob('*.bin')}
    for teacher_spec in (spec, str(copy)):  # the remedy
        prep.main([*prepare, f'--tokenizer={teacher_spec}'])
    for teacher_spec in (spec, str(copy)):
        distill.check_compatibility(teacher, teacher_spec, teacher.config, read_meta(str(data)), 16)
    assert {p.name: p.read_bytes() for p in data.glob('*.bin')} == before
    # a tokenizer with another sha256 is still refused, and the remedy does not record its files
    other = str(family_teachers['mistral'])
    assert '): tokenizer.json (other bytes); if' in refusal(other)  # (the same tokenizer_config)
    with pytest.raises(RunError, match='holds shards of a different tokenizer'):
        prep.main([*prepare, f'--tokenizer={other}'])
    assert 'tokenizer.json (other bytes)' in refusal(other)

# -----------------------------------------------------------------------------
# The sanity tool


@pytest.fixture(scope='module')
def llama_data(hf_dirs, tmp_path_factory):
    """The offline corpus tokenized with the tiny Llama's tokenizer."""
    out = tmp_path_factory.mktemp('data') / 'llama'
    prep.main(['--source=builtin', f'--tokenizer={hf_dirs["llama"]}', f'--out_dir={out}',
               '--num_proc=1', '--val_every=10'])
    return out


def test_cli_prints_the_teachers_val_loss(hf_dirs, llama_data, capsys):
    result = distill.main([f'--teacher={hf_dirs["llama"]}', f'--data_dir={llama_data}',
                           '--batches=2', '--batch_size=2', '--block_size=16', '--device=cpu'])
    out = capsys.readouterr().out
    assert ('batch 2/2' in out and f"perplexity {result['perplexity']:.2f}" in out
            and result['tokens'] == 64)
    # the same number from transformers on the documented windows: the first 4 windows of 17 tokens
    # of the val split, window k starting at token 16 k (consecutive windows share one token, as in
    # training)
    meta = json.loads((llama_data / 'meta.json').read_text())
    ids = np.concatenate([read_shard(llama_data / name)
                          for name in meta['splits']['val']['shards']])
    assert len(meta['splits']['val']['shards']) == 1  # (windows never cross shards)
    windows = torch.stack([torch.from_numpy(ids[16 * k:16 * k + 17].astype(np.int64))
                           for k in range(4)])
    logits = hf_logits(hf_dirs['llama'], windows[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert result['loss'] == pytest.approx(expected, rel=1e-5)
    assert result['perplexity'] == pytest.approx(math.exp(expected), rel=1e-5)


def test_cli_errors(hf_dirs, llama_data, our_teacher, tmp_path, capsys):
    (tmp_path / 'no_meta').mkdir()
    teacher, data = f'--teacher={hf_dirs["llama"]}', f'--data_dir={llama_data}'
    cases = [([teacher, f'--data_dir={tmp_path / "nowhere"}'], 'no such directory'),
             ([teacher, f'--data_dir={tmp_path / "no_meta"}'], 'meta.json: no such file'),
             ([f'--teacher={tmp_path / "nowhere"}', data], 'no such file or directory'),
             ([f'--teacher={our_teacher[1]}', data], 'is not the one the data was tokenized with'),
             ([teacher, data, '--block_size=129'],
              "block_size=129 is longer than the teacher's 128"),
             ([teacher, data, '--bogus=1'], 'unrecognized arguments: --bogus=1'),
             ([teacher, data, '--batches=two'], "invalid int value: 'two'"),
             ([teacher, data, '--batches=0'], '--batches=0 is out of range: must be >= 1'),
             ([data], 'the following arguments are required: --teacher')]
    # as the script runs them: a fault (status 1) or a bad flag (2), on stderr
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            run_script(distill.main, argv)
        assert e.value.code in (1, 2) and message in capsys.readouterr().err, (argv, message)


# -----------------------------------------------------------------------------
# Teachers of every supported shape with any byte-level BPE tokenizer (issue 14)



@pytest.mark.parametrize('kind', ['smollm_llama', 'mistral', 'mistral_window', 'qwen2_padded'])
def test_teachers_of_every_shape_match_transformers(kind, family_teachers):
    path = family_teachers[kind]
    teacher = distill.load_teacher(str(path))
    cfg, n_vocab = teacher.config, load_tokenizer(str(path)).n_vocab
    T = min(48, cfg.block_size)
    idx = torch.randint(0, n_vocab, (2, T), generator=torch.Generator().manual_seed(0))
    expected = hf_logits(path, idx)
    with torch.no_grad():
        got = teacher(idx)[0]
    assert rel_err(got, expected) < 1e-4
    if kind == 'qwen2_padded':
        assert cfg.vocab_size == 1280 > n_vocab and cfg.qkv_bias and cfg.tie_embeddings
    if kind == 'mistral_window':
        # exact up to the window, which is therefore the teacher's length; beyond it HF attends to
        # the last 16 positions only, and full causal attention (what this model computes) would
        # differ
        assert cfg.block_size == 16 == T
        longer = GPT(dataclasses.replace(cfg, block_size=128)).eval()
        longer.load_state_dict(teacher.state_dict())
        idx = torch.randint(0, n_vocab, (1, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert rel_err(longer(idx)[0][:, :16], hf_logits(path, idx)[:, :16]) < 1e-4
            assert rel_err(longer(idx)[0], hf_logits(path, idx)) > 1e-3
    if kind.startswith('mistral'):
        assert not cfg.qkv_bias and cfg.rope_theta == (1e6 if kind == 'mistral' else 10000.0)


def test_any_tokenizer_family_prepares_and_distills(family_teachers, tmp_path):
    """prepare_data.py and distill.py on a SmolLM-shaped Llama (refused before issue 14) and a Qwen2
    teacher whose lm_head is padded past its tokenizer: the teacher's val loss equals transformers'
    on the prepared windows; the student must have the teacher's rows (a clear error before any step
    otherwise); a window longer than Mistral's sliding window is refused."""
    for kind in ('smollm_llama', 'qwen2_padded'):
        teacher_dir = family_teachers[kind]
        data = tmp_path / kind
        prep.main(['--source=builtin', f'--tokenizer={teacher_dir}', f'--out_dir={data}',
                   '--num_proc=1', '--val_every=10', '--max_tokens=20000'])
        meta = json.loads((data / 'meta.json').read_text())
        assert meta['tokenizer']['family'] == 'bpe' and meta['tokenizer']['eos_token'] == EOT
        result = distill.main([f'--teacher={teacher_dir}', f'--data_dir={data}', '--batches=1',
                               '--batch_size=2', '--block_size=16', '--device=cpu'])
        ids = np.concatenate([read_shard(data / name) for name in meta['splits']['val']['shards']])
        windows = torch.stack([torch.from_numpy(ids[16 * k:16 * k + 17].astype(np.int64))
                               for k in range(2)])
        logits = hf_logits(teacher_dir, windows[:, :-1])
        assert result['loss'] == pytest.approx(F.cross_entropy(logits.flatten(0, 1),
                                                               windows[:, 1:].flatten()).item(),
                                               rel=1e-5)
        teacher = distill.load_teacher(str(teacher_dir))
        rows = teacher.config.vocab_size
        distill.check_compatibility(teacher, str(teacher_dir), tiny_config(vocab_size=rows), meta,
                                    16)
        # padded: fine for the data, but the student needs the teacher's rows
        if rows > meta['vocab_size']:
            with pytest.raises(RunError, match=f"set the student's vocab_size={rows}"):
                distill.check_compatibility(teacher, str(teacher_dir),
                                            tiny_config(vocab_size=meta['vocab_size']), meta, 16)
    # the other teacher's data: its tokenizer differs, and so do its files, named with the data's
    # tokenizer by family and size
    with pytest.raises(RunError, match=re.escape(
            "its tokenizer files are not known to build the data's tokenizer (bpe, ")
            + r"[\d,]+ tokens, from .*qwen2_padded\): tokenizer.json \(other bytes\), "
            r"tokenizer_config.json \(other bytes\); if"):
        distill.main([f'--teacher={family_teachers["smollm_llama"]}',
                      f'--data_dir={tmp_path / "qwen2_padded"}'])
    # Mistral's sliding window caps the teacher's length: a longer window is refused, alone among
    # the checks
    spec = str(family_teachers['mistral_window'])
    own = prepared_tokenizer(spec)
    with pytest.raises(RunError) as e:
        distill.check_compatibility(distill.load_teacher(spec), spec, None,
                                    dict(tokenizer=own, vocab_size=own['n_vocab']), 17)
    assert str(e.value).count('\n  - ') == 1
    assert "block_size=17 is longer than the teacher's 16 positions" in str(e.value)
    assert 'sliding_window' in str(e.value)
