"""The paper's student configs: shapes, extra parameters (ΔParams of Tables 1-2), meta-device build,
and the training keys every paper config must set."""
import glob
import math
import os
import resource

import pytest
import torch

from model import FIELD_NAMES, GPT, ModelConfig
from lmkit.runs import load_config
from helpers import readme_commands

CONFIG_DIR = os.path.join(os.path.dirname(__file__), '..', 'config')

# Extra parameters over the softmax model of the same size: the paper's Tables 1-2 (Delta Params,
# given there in millions: 0.4M, 1.0M, 2.1M, 67.1M, 264.2M), written out in full. Sink adds one
# logit per head and layer ("0.0M").
PAPER_DELTA = {
    ('affine', '0.5b'): 393_216, ('affine', '1b'): 1_048_576, ('affine', '3b'): 2_064_384,
    ('gated', '1b'): 67_108_864, ('gated', '3b'): 264_241_152,
    ('affine_gated', '1b'): 67_108_864 + 1_048_576, ('affine_gated', '3b'): 264_241_152 + 2_064_384,
    ('affine_gated_sigmoid', '1b'): 67_108_864 + 1_048_576,
    ('sink', '0.5b'): 24 * 16, ('sink', '1b'): 16 * 32, ('sink', '3b'): 28 * 24,
    ('softmax', '0.5b'): 0, ('softmax', '1b'): 0, ('softmax', '3b'): 0,
}
# Total parameters of the softmax students = the HF models they copy (tied embeddings): Llama-3.2-1B
# and -3B are 1,235,814,400 and 3,212,749,824 (Meta's model cards: 1.23B / 3.21B); Qwen1.5-0.5B with
# tied embeddings is 463,987,712.
HF_TOTAL = {'0.5b': 463_987_712, '1b': 1_235_814_400, '3b': 3_212_749_824}


def read_config(*argv):
    """The model keys of config files (and overrides), read and validated by train.py's
    configurator."""
    config = load_config(list(argv))
    return {k: config[k] for k in FIELD_NAMES}


def paper_configs():
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, '*_*b.py'))):
        variant, size = os.path.basename(path)[:-3].rsplit('_', 1)
        yield variant, size, path


def build_on_meta(values):
    with torch.device('meta'):
        return GPT(ModelConfig(**values))


def test_every_paper_row_has_a_config():
    assert {(v, s) for v, s, _ in paper_configs()} == set(PAPER_DELTA)


@pytest.mark.parametrize('variant,size,path', list(paper_configs()),
                         ids=lambda x: str(x).split('/')[-1])
def test_paper_config_delta_params(variant, size, path):
    model = build_on_meta(read_config(path))
    softmax = build_on_meta(read_config(os.path.join(CONFIG_DIR, f'softmax_{size}.py')))
    assert softmax.get_num_params() == HF_TOTAL[size]
    assert model.get_num_params() - softmax.get_num_params() == PAPER_DELTA[(variant, size)]
    expected_act = 'sigmoid' if variant == 'affine_gated_sigmoid' else 'linear_clip'
    assert model.config.attention == variant.replace('_sigmoid',
                                                     '') and model.config.affine_act == expected_act


def test_the_headwise_gate_is_the_size_of_affines_alpha_at_the_sink_studys_shape():
    """Qiu et al.'s head-wise gate, W_g n_embd x n_head per layer, adds to softmax exactly what
    affine's W_alpha (Eq. 7) adds, at the sink study's shape (v2's recipe on v1's: the tiny shape,
    4 layers of 128 channels and 4 heads): 4 x 128 x 4 parameters, on every variant it joins."""
    study = [os.path.join(CONFIG_DIR, name) for name in ('sink_study.py', 'sink_study_v2.py')]

    def delta(*argv):  # (the model keys, ΔParams), checked against the softmax model's count
        values = read_config(*study, *argv)
        model = GPT(ModelConfig(**values))
        softmax = GPT(ModelConfig(**values | dict(attention='softmax', gate='none')))
        added = model.get_num_params(variant_only=True)
        assert model.get_num_params() - softmax.get_num_params() == added
        return values, added

    values, headwise = delta('--attention=headwise_gated')
    assert (values['n_layer'], values['n_embd'], values['n_head']) == (4, 128, 4)
    assert headwise == delta('--attention=affine')[1] == 4 * 128 * 4
    assert delta('--attention=sink', '--gate=headwise')[1] == 4 * 128 * 4 + 4 * 4  # and the sinks
    assert delta('--attention=affine', '--gate=headwise')[1] == 2 * 4 * 128 * 4
    assert delta('--attention=gated')[1] == 4 * 128 * 128  # the elementwise gate: n_embd x n_embd


def test_meta_device_build_allocates_nothing():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    model = build_on_meta(read_config(os.path.join(CONFIG_DIR, 'affine_gated_3b.py')))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert all(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert grown_mib < 200, ('building a 3.5B-parameter model on meta grew peak RSS by '
                             f'{grown_mib:.0f} MiB')
    # and it becomes a real model after to_empty + the model's own init (what loaders will do)
    tiny = ModelConfig(attention='affine_gated')
    with torch.device('meta'):
        model = GPT(tiny)
    model = model.to_empty(device='cpu')
    model.apply(model._init_weights)
    assert all(float(layer.self_attn.alpha_ma.abs().sum()) == 0 for layer in model.model.layers)
    logits, loss = model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
    assert torch.isfinite(loss)


@pytest.mark.parametrize('attention', ['softmax', 'sink', 'gated', 'affine', 'affine_gated'])
def test_tiny_cpu_config_runs_every_variant(attention):
    values = read_config(os.path.join(CONFIG_DIR, 'tiny_cpu.py'))
    values['attention'] = attention
    model = GPT(ModelConfig(**values))
    tokens = torch.randint(0, 257, (2, values['block_size'] + 1))
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert abs(loss.item() - math.log(320)) < 0.2  # an untrained model predicts about uniformly
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('variant,size,path', list(paper_configs()),
                         ids=lambda x: str(x).split('/')[-1])
def test_paper_configs_name_their_data_teacher_and_out_dir(variant, size, path):
    config = load_config([path])
    name = os.path.basename(path)[:-3]
    assert config['out_dir'] == f'out/{name}'
    tokenizer = 'qwen' if size == '0.5b' else 'llama3'
    assert config['data_dir'] == f'data/fineweb_edu_{tokenizer}'
    teacher = {'0.5b': 'Qwen1.5-1.8B', '1b': 'Llama-3.2-3B', '3b': 'Llama-3.1-8B'}[size]
    assert config['teacher'] == f'checkpoints/{teacher}'
    assert (config['global_batch_size'] == 1024 and config['block_size'] == 2048
            and config['max_iters'] == 9000)


def test_model_key_sets_a_published_shape_and_later_keys_win(tmp_path):
    from model import MODEL_SHAPES
    config = load_config(['--model=llama3.2-3b'])
    assert config['model'] == 'llama3.2-3b' and all(config[k] == v for k,
                                                    v in MODEL_SHAPES['llama3.2-3b'].items())
    path = tmp_path / 'c.py'
    # the shape replaces n_layer, not n_head
    path.write_text("n_layer = 2\nmodel = 'qwen1.5-0.5b'\nn_head = 8\n")
    config = load_config([str(path), '--rms_norm_eps=1e-5'])
    assert (config['n_layer'], config['n_head'], config['n_embd'], config['rms_norm_eps']) == (24,
                                                                                               8,
                                                                                               1024,
                                                                                               1e-5)


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(SystemExit, match=r"^--model=llama9: invalid choice: model='llama9'; valid "
                                         r"values: "
                                         r"qwen1.5-0.5b, qwen1.5-1.8b, llama3.2-1b, llama3.2-3b, "
                                         r"llama3.1-8b, " r"smollm2-135m, smollm2-360m, tiny$"):
        load_config(['--model=llama9'])


@pytest.mark.parametrize('variant', ['softmax', 'sink', 'gated', 'affine', 'affine_gated'])
def test_one_gpu_tier_fits_one_gpu(variant, monkeypatch):
    """config/onegpu.py --attention=<variant>, as README.md's loop trains it (its header gives the
    same loop): a SmolLM2-135M-shaped student (134,515,008 parameters as softmax: SmolLM2-135M's own
    count, tied embeddings), KD from SmolLM2-360M (its published shape: 361,821,120 parameters, the
    published count), whose plan fits one 24 GiB GPU with the dry run's margin at the loop's
    micro-batch: the config's own, but for affine_gated 4 (at the config's it does not fit)."""
    from lmkit import memory_plan, runs
    monkeypatch.chdir(os.path.dirname(CONFIG_DIR))  # the README's paths are the repository's
    _, commands = readme_commands('Try it on one GPU')
    c = load_config(next(argv[2:] for argv in commands if argv[1] == 'train.py'
                         and f'--attention={variant}' in argv))
    own = load_config([os.path.join(CONFIG_DIR, 'onegpu.py')])['micro_batch_size']
    student, teacher = memory_plan.planned_models(runs.run_config(c))
    assert os.path.basename(c['teacher']) == 'SmolLM2-360M'
    assert c['dry_run_world_size'] == 1 and c['dry_run_gpu_gib'] == 24
    softmax = ModelConfig(**{**vars(student), 'attention': 'softmax'})
    assert sum(p.numel() for p in build_on_meta(vars(softmax)).parameters()) == 134_515_008
    assert sum(p.numel() for p in build_on_meta(vars(teacher)).parameters()) == 361_821_120
    verdict = lambda **override: memory_plan.verdict(
        sum(memory_plan.memory_plan(runs.run_config(c | override), student,
                                    teacher).values()) / 2**30, 24)
    assert verdict() == 'fits'
    if variant == 'affine_gated':
        assert c['micro_batch_size'] == 4 and verdict(micro_batch_size=own) != 'fits'
    else:
        assert c['micro_batch_size'] == own
