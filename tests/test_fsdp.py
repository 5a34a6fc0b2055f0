"""fsdp=True (PyTorch FSDP2 on CPU with gloo), activation checkpointing, and the dry run's memory
plan."""
import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch

from lmkit import distributed
from lmkit import memory_plan
import train
from lmkit.errors import RunError
from model import ATTENTIONS, FIELD_NAMES, GPT, ModelConfig
from helpers import ROOT, metrics, tiny_args


def torchrun(nproc, args):
    result = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                             f'--nproc_per_node={nproc}', 'train.py', *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize('attention', ['affine', 'sink'])
def test_fsdp_matches_one_process_and_resumes_on_another_world_size(data_dir, tmp_path, attention):
    # a teacher for KD (tied student embeddings: FSDP's root group holds lm_head = embed_tokens,
    # which the KD loss reads after the forward); init_std=0.3 spreads alpha, so a wrong alpha_ma
    # reduction shows
    train.main(tiny_args(data_dir, tmp_path / 'teacher', '--max_iters=1', '--n_layer=1'))
    args = [f'--attention={attention}', f'--teacher={tmp_path / "teacher"}',
            '--tie_embeddings=True',
            '--init_std=0.3', '--micro_batch_size=2', '--eval_interval=2', '--eval_batches=3']
    one, sharded = tmp_path / 'one', tmp_path / 'sharded'
    train.main(tiny_args(data_dir, one, *args, '--max_iters=4'))  # 1 process x 4 micro-steps
    # 2 ranks x 2 micro-steps for steps 1-2 (3 eval batches: the ranks run 2 forwards each), then
    # the 2-rank checkpoint resumed by 1 FSDP rank with activation checkpointing for steps 3-4
    torchrun(2, tiny_args(data_dir, sharded, *args, '--max_iters=2', '--fsdp=True'))
    torchrun(1,
             tiny_args(data_dir, sharded, *args, '--max_iters=4', '--fsdp=True',
                       '--activation_checkpointing=True', '--init_from=resume'))
    a, b = metrics(one), metrics(sharded)
    assert [r['step'] for r in b] == [1, 2, 3, 4]
    # The runs sum gradients, losses and statistics in different orders (1 process vs 2 ranks, then
    # 1 FSDP rank), so they agree to float32 rounding, not bit for bit: rel=1e-5, ~80 float32 ulps
    # (measured: <= 1e-7 relative). attn_logit_mean is a mean of signed logits that nearly cancel
    # (sink: -8.7e-4 from logits of mean size 2.3), so 1e-5 of itself (9e-9) is below the float32
    # rounding of one of its terms (2.4e-7 at 2.3), and 2 ranks were 7e-8 off. Each logit agreeing
    # to rel 1e-5 bounds the mean's difference by 1e-5 x the mean |logit|: that is its abs, with
    # attn_logit_abs_mean (compared too, at rel=1e-5) as the mean |logit|.
    for key in ('loss', 'kd_loss', 'ce_loss', 'grad_norm', 'val_loss', 'attn_logit_abs_mean',
                'attn_logit_mean'):
        # None where a step does not log the key
        got, want = [r.get(key) for r in b], [r.get(key) for r in a]
        assert [v is None for v in got] == [v is None for v in want]
        for step, (g, w) in enumerate(zip(got, want), 1):
            if w is not None:
                terms = a[step - 1]['attn_logit_abs_mean'] if key == 'attn_logit_mean' else 0.0
                assert g == pytest.approx(w, rel=1e-5, abs=1e-5 * terms), f'{key} at step {step}'
    if attention == 'sink':  # a sharded parameter, gathered for the statistics
        # logged rounded to 5 decimals (inspection.variant_tensor_means): values equal up to float32
        # rounding may round to neighbours, whose difference is a hair over 1e-5 (0.32148 - 0.32147
        # = 1.000000000001e-05), which abs=1e-5 refused; 1.5e-5 accepts the same or the adjacent 5th
        # decimal, nothing further
        assert b[-1]['sinks'] == pytest.approx(a[-1]['sinks'], abs=1.5e-5)
    # the checkpoints: full tensors under the same names, whatever wrote them
    ref, got = (torch.load(d / 'ckpt.pt', weights_only=False) for d in (one, sharded))
    assert got['model'].keys() == ref['model'].keys()
    assert got['optimizer']['state'].keys() == ref['optimizer']['state'].keys()
    for name, tensor in ref['model'].items():  # alpha_ma included: global-batch exact
        torch.testing.assert_close(got['model'][name], tensor, rtol=1e-5, atol=1e-6)
    for name, state in ref['optimizer']['state'].items():
        torch.testing.assert_close(got['optimizer']['state'][name], state, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize('attention', ATTENTIONS)
def test_activation_checkpointing_gives_identical_gradients_and_saves_less(attention):
    # tied embeddings: every parameter gets a gradient from the hidden states
    config = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176,
                         attention=attention, init_std=0.3, tie_embeddings=True)
    tokens = torch.randint(0, config.vocab_size, (3, 40))
    saved, grads = {}, {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        for layer in model.model.layers:
            layer.activation_checkpointing = checkpointing
        hidden, saved[checkpointing] = saved_bytes(lambda: model(tokens, return_hidden=True)[0],
                                                    exclude=model.parameters())
        hidden.square().mean().backward()
        grads[checkpointing] = {name: p.grad for name, p in model.named_parameters()}
        # affine: alpha counted once, not again when recomputed
        grads[checkpointing].update(model.named_buffers())
    for name, grad in grads[False].items():
        assert torch.equal(grads[True][name], grad), name
    assert saved[True] < saved[False] / 5


def saved_bytes(forward, autocast=False, exclude=()):
    """(forward()'s output, the bytes autograd saved for its backward): each storage once, those of
    the tensors in `exclude` (the parameters) left out."""
    storages = {}
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast('cpu', dtype=torch.bfloat16) if autocast else nullcontext():
        out = forward()
    return out, sum(storages.values())


@pytest.mark.parametrize('attention', ATTENTIONS)
@pytest.mark.parametrize('mode', ['float32', 'autocast', 'bf16 weights'])
def test_activation_estimate_counts_what_autograd_saves(attention, mode):
    """memory_plan.memory_estimate's activations of one decoder layer vs the bytes autograd really
    saves for one (the difference between a 2-layer and a 1-layer model), in each precision train.py
    runs: float32, fp32 weights under bf16 autocast (DDP), bf16 weights under autocast (FSDP's mixed
    precision)."""
    # enough tokens that autocast's bf16 weight copies (also saved) are ~2% of the count
    batch, T = 4, 256
    measured, estimated = [], []
    for n_layer in (1, 2):
        config = ModelConfig(n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=64,
                             intermediate_size=176, block_size=T, attention=attention)
        model = GPT(config).to(torch.bfloat16 if mode == 'bf16 weights' else torch.float32)
        idx = torch.randint(0, config.vocab_size, (batch, T))
        measured.append(saved_bytes(lambda: model(idx, return_hidden=True), mode != 'float32',
                                    model.parameters())[1])
        estimate = memory_plan.memory_estimate(config, 1, batch, 'float32' if mode == 'float32'
                                               else 'bfloat16', mode == 'bf16 weights', False)
        estimated.append(estimate['activations'])
    # the estimate also counts one layer of gradients in flight in backward, i.e. its per-layer step
    # is the same
    assert estimated[1] - estimated[0] == pytest.approx(measured[1] - measured[0], rel=0.1)


def test_each_gate_saves_what_the_plan_says():
    """What each gate adds to the bytes a layer saves for backward (the gated model's less the
    ungated one's, float32) is the plan's to the byte: the elementwise gate's input and its (B, T,
    H * D) sigmoid; the head-wise gate's input and its (B, T, H) sigmoid, much less."""
    batch, T = 2, 64
    added = {}
    for gate in ('none', 'elementwise', 'headwise'):
        config = ModelConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=176,
                             block_size=T, attention='sink', gate=gate)
        model = GPT(config)
        idx = torch.randint(0, config.vocab_size, (batch, T))
        measured = saved_bytes(lambda: model(idx, return_hidden=True), False, model.parameters())[1]
        plan = memory_plan.saved_bytes_per_token(config, 'float32', fsdp=False)
        added[gate] = (measured, plan * batch * T)
    for gate in ('elementwise', 'headwise'):
        assert added[gate][0] - added['none'][0] == added[gate][1] - added['none'][1]
    # 4 bytes: the gate's input (H * D = 64 values) and its sigmoid, 64 or 4 values, per token
    assert [added[gate][0] - added['none'][0] for gate in ('elementwise', 'headwise')] == [
        4 * (64 + 64) * batch * T, 4 * (64 + 4) * batch * T]


def test_memory_plan_for_the_3b_row(capsys):
    """The issue's arithmetic: the 3B student with AdamW does not fit an 80 GB GPU under DDP next to
    the 8B teacher; FSDP over 8 GPUs shards its weights, gradients and AdamW state 8 ways, and it
    fits."""
    train.main(['config/affine_3b.py', '--dry_run=True', '--fsdp=False'])
    ddp = capsys.readouterr().out
    train.main(['config/affine_3b.py', '--dry_run=True', '--fsdp=True', '--micro_batch_size=2'])
    fsdp = capsys.readouterr().out
    assert ("teacher: Llama-3.1-8B's published shape (no checkpoint at checkpoints/Llama-3.1-8B)"
            in ddp)
    assert 'does not fit' in ddp and ': fits' in fsdp and 'FSDP on 8 GPUs' in fsdp
    values = train.load_config(['config/affine_3b.py'])
    config = ModelConfig(**{k: values[k] for k in FIELD_NAMES})
    teacher = ModelConfig(**memory_plan.KNOWN_TEACHERS['Llama-3.1-8B'])
    plans = {fsdp: memory_plan.memory_estimate(config, 8, 2, 'bfloat16', fsdp, False, teacher)
             for fsdp in (False, True)}
    assert plans[True]['optimizer'] == plans[False]['optimizer'] / 8 == 3_214_814_208
    # whole on every rank, bf16
    assert plans[True]['teacher'] == plans[False]['teacher'] > 2 * 8_030_261_248
    checkpointed = memory_plan.memory_estimate(config, 8, 2, 'bfloat16', True, True,
                                               teacher)['activations']
    assert checkpointed < plans[True]['activations'] / 5


def test_teacher_shape_from_a_checkpoint_or_the_known_table(data_dir, tmp_path):
    train.main(tiny_args(data_dir, tmp_path, '--max_iters=1', '--n_layer=1'))
    shape, source = memory_plan.teacher_shape(str(tmp_path))
    assert shape.n_layer == 1 and shape.n_embd == 32 and source.endswith('ckpt.pt')
    shape, source = memory_plan.teacher_shape('elsewhere/Qwen1.5-1.8B')
    assert shape.n_embd == 2048 and not shape.tie_embeddings and 'published shape' in source
    assert memory_plan.teacher_shape('elsewhere/MyTeacher')[0] is None


def test_fsdp_needs_torchrun(data_dir, tmp_path):
    with pytest.raises(RunError, match='fsdp=True shards the model over the ranks torchrun starts'):
        train.main(tiny_args(data_dir, tmp_path, '--fsdp=True', '--max_iters=1'))


def _compiled_fsdp_worker(rank, world_size, init_file, result_file):
    """train.py's FSDP path with compile=True (compile_layers, then apply_fsdp) on 1 gloo rank: a
    forward and backward, then dynamo's counters."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world_size)
    try:
        torch.manual_seed(0)
        model = GPT(ModelConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, intermediate_size=64,
                                vocab_size=97,
                                block_size=16, attention='affine', tie_embeddings=True))
        distributed.compile_layers(model)
        distributed.apply_fsdp(model, 'float32')
        wrapped = model
        idx = torch.randint(0, 97, (2, 16))
        _, loss = wrapped(idx, idx)
        loss.backward()
        compiled = [layer._compiled_call_impl is not None for layer in model.model.layers]
        torch.save(dict(breaks=dict(counters['graph_break']),
                        frames=counters['stats']['unique_graphs'],
                        compiled=compiled, whole=type(wrapped).__name__), result_file)
        dist.barrier()
        del wrapped
    finally:
        dist.destroy_process_group()


def test_each_layer_compiles_whole_under_fsdp(tmp_path):
    """The decoder layers are compiled one by one (distributed.compile_layers), so FSDP2's per-layer
    hooks cannot break a graph: the layers run compiled graphs with no graph break; the model itself
    is not compiled whole. (CPU inductor compilation takes ~40 s on 2 cores, so DDP, which wraps the
    same compiled layers, is not compiled here too.)"""
    torch.multiprocessing.spawn(_compiled_fsdp_worker,
                                args=(1, str(tmp_path / 'init'), str(tmp_path / 'r.pt')),
                                nprocs=1, join=True)
    r = torch.load(tmp_path / 'r.pt', weights_only=False)
    assert r['compiled'] == [True, True] and r['whole'] == 'FSDPGPT'
    assert r['breaks'] == {}
    assert r['frames'] >= 1
