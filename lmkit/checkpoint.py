"""Checkpoints as dicts and tensors: this repo's ckpt.pt, read and written, and Hugging Face model
directories, read (lmkit/pretrained.py builds the GPT), with the same checks and one-line errors
for every reader. Reading a ckpt.pt runs no code from it (docs/implementation.md, "What opening a
file may run"); what it holds: docs/training.md, "Checkpoints and preemption"."""
import contextlib
import io
import json
import os
import pickle
import pickletools
import sys
import zipfile
from collections import OrderedDict

import numpy as np
import torch

from .errors import RunError
from .files import atomic_write

CKPT_NAME = 'ckpt.pt'
CKPT_KEYS = ('model', 'optimizer', 'step', 'rng', 'config', 'model_config', 'tokenizer', 'data')


class CheckpointError(RunError, ValueError):
    """A file that cannot be read as the checkpoint it should be; the message says what to do."""

# Ours: ckpt.pt ---------------------------------------------------------------------------------


def checkpoint_file(spec):
    """The ckpt.pt of one of this repo's checkpoints (the file, or train.py's out_dir holding it),
    or None for a Hugging Face directory (config.json, no ckpt.pt)."""
    for path in (spec, os.path.join(spec, CKPT_NAME)):
        if os.path.isfile(path):
            return path
    if os.path.isfile(os.path.join(spec, 'config.json')):
        if is_run_config(spec):  # train.py writes config.json at its start, ckpt.pt later
            raise CheckpointError(f"{spec}: a train.py run directory with no {CKPT_NAME} yet (a "
                                  "run saves it at every eval_interval steps and at its end); wait "
                                  "for its first save, or give a run that has one")
        return None
    if os.path.isdir(spec):
        raise CheckpointError(f"{spec}: a directory with neither config.json (a Hugging Face "
                              f"checkpoint) nor {CKPT_NAME} (this repo's); give a train.py "
                              f"out_dir, its {CKPT_NAME}, or a Hugging Face model directory")
    raise FileNotFoundError(f"{spec}: no such file or directory")


def is_run_config(out_dir):
    """Whether out_dir/config.json is train.py's resolved config rather than a model's."""
    try:
        with open(os.path.join(out_dir, 'config.json')) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {'init_from', 'max_iters', 'out_dir'} <= set(config)


def unreadable(path, error):
    """Why torch.load could not read path, in words that fit the file. For an empty file, or one
    that is no zip archive, torch's own message misleads: it advises another way to save it."""
    if (size := os.path.getsize(path)) == 0:
        return "the file is empty"
    if not zipfile.is_zipfile(path):
        return f"its {size:,} bytes are not the zip archive torch.save writes"
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def read_checkpoint(path, keys=('model', 'model_config', 'tokenizer')):
    """One of this repo's checkpoints, read as data only and memory-mapped (only the tensors used
    are read; a node's ranks share one copy). Every tensor under keys (a model's, by default) must
    match its checksum, and the model's weights must be finite: a diverged run's give garbage."""
    ckpt = load_data_only(path)
    if missing := [key for key in keys if not isinstance(ckpt, dict) or key not in ckpt]:
        raise CheckpointError(f"{path} is not a checkpoint written by train.py: it has no "
                              f"{', '.join(missing)}")
    verify_checkpoint(path, keys)
    state = ckpt['model'] if 'model' in keys else {}
    floats = [name for name, t in state.items() if t.is_floating_point()]
    if bad := [name for name in floats if not bool(torch.isfinite(state[name]).all())]:
        raise CheckpointError(f"{path} holds weights that are not finite: {len(bad)} of its "
                              f"{len(floats)} float tensors hold NaN or infinity, the first "
                              f"{bad[0]} (a run that diverged); nothing was loaded from it; "
                              f"{fallback(path)}, or train again with a lower learning rate")
    return ckpt


# What a checkpoint may name: what torch.save writes for tensors (rebuild functions, storage types,
# OrderedDict, bytes) and numpy for its random state. Nothing else is resolved, let alone called.
_RECONSTRUCT = np.zeros(0).__reduce__()[0]  # the function numpy pickles an array with
NUMPY_GLOBALS = {'numpy._core.multiarray._reconstruct': _RECONSTRUCT,  # numpy 2's name of it
                 'numpy.core.multiarray._reconstruct': _RECONSTRUCT,  # numpy 1.x's
                 'numpy.ndarray': np.ndarray, 'numpy.dtype': np.dtype}
TORCH_GLOBALS = ('torch._utils._rebuild_tensor_v2', 'torch._utils._rebuild_tensor_v3',
                 'collections.OrderedDict', '_codecs.encode')
# what weights_only=True must allow beyond torch's list: numpy's names, the uint32 dtype's class
SAFE_GLOBALS = [(obj, name) for name, obj in NUMPY_GLOBALS.items()] + [type(np.dtype(np.uint32))]


def allowed_global(name):
    """Whether a checkpoint may name the global `name` (module.qualified_name)."""
    module, _, attr = name.rpartition('.')
    return (name in TORCH_GLOBALS or name in NUMPY_GLOBALS
            or (module == 'torch' and attr.endswith('Storage')))


def code_in(pickled):
    """The globals that the pickle `pickled` (bytes) names and a checkpoint may not
    (allowed_global), found without unpickling it: what loading it would look up, and may call."""
    found, strings = [], []
    for opcode, arg, _ in pickletools.genops(pickled):
        if opcode.name in ('GLOBAL', 'INST') and not allowed_global(arg.replace(' ', '.')):
            found.append(arg.replace(' ', '.'))
        elif opcode.name == 'STACK_GLOBAL':  # not torch.save's: named by the last two strings
            found.append('.'.join(strings[-2:]) or opcode.name)
        elif opcode.name.startswith('EXT'):  # a global by its copyreg number: not torch.save's
            found.append(f"copyreg extension {arg}")
        elif isinstance(arg, str):
            strings.append(arg)
    return found


def held_code(names):
    """What a file holds that names the globals `names`, for refused."""
    names = list(dict.fromkeys(names))
    return (f"code, not only data: the global{'s' if len(names) > 1 else ''} "
            f"{', '.join(map(repr, names))} (which loading it would call)")


def refused(path, what):
    """The one line for a file that holds `what`, which no checkpoint holds; nothing was run."""
    return CheckpointError(f"{path} is refused: it holds {what}; a checkpoint of train.py holds "
                           "only tensors, plain values and numpy's random state. Nothing in it was "
                           "run. Do not open it with torch.load either; ask its source for the "
                           "model as safetensors (export_hf.py writes them)")


def load_data_only(path):
    """torch.load of a checkpoint that runs no code from it: every pickle in it is scanned
    (code_in), then torch.load(weights_only=True) builds only tensors, plain values and
    SAFE_GLOBALS. A file that is not the zip archive memory-mapping needs is refused unread."""
    try:
        with zipfile.ZipFile(path) as archive:
            code = [name for info in archive.infolist() if info.filename.endswith('.pkl')
                    for name in code_in(archive.read(info))]
    except (zipfile.BadZipFile, ValueError, OSError):
        # not a zip, damaged, or saved without CRCs (zipfile balks): torch.load's refusal says which
        code = []
    if code:
        raise refused(path, held_code(code))
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location='cpu', mmap=True, weights_only=True)
    except pickle.UnpicklingError as e:
        # Keep the line that says what; the others offer weights_only=False, which would run code.
        lines = [line.strip() for line in str(e).splitlines()
                 if line.strip() and 'Check the documentation' not in line]
        reason = lines[-1].rpartition('WeightsUnpickler error: ')[2] if lines else 'no reason given'
        raise refused(path, f"what torch.load(weights_only=True) refuses ({reason})") from None
    except Exception as e:  # truncated (a copy cut short), corrupt, or not a torch file at all
        raise CheckpointError(f"{path} is not a readable checkpoint of train.py "
                              f"({unreadable(path, e)}): it is truncated, corrupt or another kind "
                              "of file (train.py writes it atomically, so it changed since); "
                              f"{fallback(path)}") from None


class _StorageRef(str):
    """The key of the zip record, data/<key>, that holds one tensor's bytes."""


class _Inert:
    """What the checksum pass builds for a global it does not need: nothing is called or kept."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _TensorsAsRecords(pickle.Unpickler):
    """A torch.save'd file's data.pkl read with each tensor as the _StorageRef of its record,
    OrderedDict as itself, and every other global a checkpoint may name as _Inert."""

    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def persistent_load(self, saved_id):  # ('storage', type, key, location, numel)
        return _StorageRef(saved_id[2])

    def find_class(self, module, name):
        if not allowed_global(f"{module}.{name}"):  # (load_data_only refuses such a file first)
            raise refused(self.path, held_code([f"{module}.{name}"]))
        if module == 'torch._utils':
            return lambda ref, *args, **kwargs: ref
        return OrderedDict if (module, name) == ('collections', 'OrderedDict') else _Inert


def _records(obj, where):
    """(where, record key) of every tensor in obj, a nest of dicts, lists and tuples."""
    if isinstance(obj, _StorageRef):
        yield where, obj
    elif isinstance(obj, (dict, list, tuple)):
        is_dict = isinstance(obj, dict)
        for k, v in obj.items() if is_dict else enumerate(obj):
            yield from _records(v, f"{where}.{k}" if is_dict else f"{where}[{k}]")


def verify_checkpoint(path, keys):
    """CheckpointError unless the bytes of every tensor under `keys` match the CRC-32 torch.save
    stored with them (damage, not tampering), each record read once into the page cache that the
    mmap shares. A file without checksums is read with a note; load_data_only refused a non-zip."""
    with zipfile.ZipFile(path) as archive:
        pickled = next(info for info in archive.infolist() if info.filename.endswith('/data.pkl'))
        if pickled.CRC == 0:  # torch.utils.serialization.config.save.compute_crc32 was off
            print(f"note: {path} was saved without checksums: read unverified", file=sys.stderr)
            return
        prefix, where = pickled.filename[:-len('data.pkl')], 'its index'
        try:
            tree = _TensorsAsRecords(io.BytesIO(archive.read(pickled)), path).load()
            records = {record: name for key in keys for name, record in _records(tree[key], key)}
            for record, where in records.items():
                with archive.open(f"{prefix}data/{record}") as f:
                    while f.read(1 << 24):  # zipfile checks the CRC-32 once it has read all
                        pass
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise CheckpointError(f"{path} is damaged: {where} does not match the checksum written "
                                  f"with it ({e}); nothing was loaded from it; "
                                  f"{fallback(path)}") from None


def previous_checkpoint(path):
    """Where save_checkpoint keeps the checkpoint before the latest (ckpt.prev.pt)."""
    root, ext = os.path.splitext(path)
    return f"{root}.prev{ext}"


def fallback(path):
    """What to do about a checkpoint that cannot be read: fall back to its previous one, if any."""
    prev = previous_checkpoint(path)
    if os.path.isfile(prev):
        return (f"fall back to the checkpoint saved before it: mv {prev} {path} (or restore {path} "
                "from a copy)")
    return "restore it from a copy, or use another checkpoint"


def model_state(ckpt):
    """The GPT's tensors of a checkpoint, less the _orig_mod. of a torch.compile'd model's names."""
    return {key.removeprefix('_orig_mod.'): t for key, t in ckpt['model'].items()}


def save_checkpoint(path, state, keep_previous=True):
    """Save atomically: a crash or a full disk mid-save leaves the previous checkpoint as it was.
    keep_previous keeps the one replaced as previous_checkpoint(path), a hard link, and removes the
    one before it first, so a save needs no more room than one new checkpoint."""
    prev = previous_checkpoint(path)
    if keep_previous and os.path.isfile(path) and os.path.isfile(prev):
        os.remove(prev)
    with atomic_write(path, 'wb') as f:
        torch.save(state, f)
        if keep_previous and os.path.isfile(path):
            with contextlib.suppress(OSError):  # no hard links on this file system: no copy kept
                os.link(path, prev)

# Hugging Face's: config.json and safetensors ----------------------------------------------------


def read_hf_config(path):
    with open(os.path.join(path, 'config.json')) as f:
        return json.load(f)


def config_from_hf(hf):
    """ModelConfig's fields (a dict) of a config.json (a dict): a Llama (2/3/3.1/3.2), Mistral or
    Qwen2 (also Qwen1.5, Qwen2.5) model's, whose attention is then softmax, or an export's own.
    A setting this model would not reproduce exactly is a ValueError, never a silent change."""
    if 'model_config' in hf:  # an export of a variant that transformers does not compute
        return dict(hf['model_config'])
    model_type = hf.get('model_type')
    if model_type not in ('llama', 'mistral', 'qwen2'):
        raise ValueError(f"config.json: model_type {model_type!r} is not supported; supported: "
                         "'llama' (Llama 2/3), 'mistral' (Mistral), 'qwen2' "
                         "(Qwen1.5/Qwen2/Qwen2.5)")
    # transformers >= 5 writes rope_parameters (rope_theta inside); the hub's have rope_scaling
    rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
    rope_type = rope.get('rope_type', rope.get('type', 'default'))
    if rope_type not in ('default', 'llama3'):
        raise ValueError(f"config.json: rope_type {rope_type!r} is not supported; supported: "
                         "'default', 'llama3'")
    n_head, n_embd = hf['num_attention_heads'], hf['hidden_size']
    # head_dim null, as transformers 4.57 writes Mistral's, is hidden_size / num_attention_heads
    unsupported_if = dict(attention_bias=hf.get('attention_bias'), mlp_bias=hf.get('mlp_bias'),
                          use_sliding_window=hf.get('use_sliding_window'),
                          hidden_act=hf.get('hidden_act', 'silu') != 'silu',
                          head_dim=hf.get('head_dim') not in (None, n_embd // n_head))
    if unsupported := {key: hf[key] for key, bad in unsupported_if.items() if bad}:
        raise ValueError(f"config.json: unsupported settings {unsupported}")
    # Mistral attends to the last sliding_window positions: full causal attention up to that length,
    # so the length is capped there (distill.py refuses a longer one), never computed differently
    lengths = hf['max_position_embeddings'], sliding_window(hf)
    block_size = min(n for n in lengths if n is not None)
    llama3 = {k: v for k, v in rope.items() if k != 'rope_theta'} if rope_type == 'llama3' else None
    return dict(n_layer=hf['num_hidden_layers'], intermediate_size=hf['intermediate_size'],
                n_head=n_head, n_kv_head=hf.get('num_key_value_heads') or n_head, n_embd=n_embd,
                vocab_size=hf['vocab_size'], block_size=block_size, rms_norm_eps=hf['rms_norm_eps'],
                rope_theta=hf.get('rope_theta', rope.get('rope_theta', 1e4)), rope_scaling=llama3,
                qkv_bias=model_type == 'qwen2', tie_embeddings=hf.get('tie_word_embeddings', False),
                init_std=hf.get('initializer_range', 0.02))


def sliding_window(hf):
    """A Mistral config.json's sliding_window, which caps the model's length, or None."""
    return hf.get('sliding_window') if hf.get('model_type') == 'mistral' else None


def read_safetensors(path, dtype, device, keep_fp32=()):
    """Every tensor of a Hugging Face directory, cast to dtype (keep_fp32's, an export's float32
    buffers, to float32) and moved to device as it is read, so that a GPU rank holds one tensor at a
    time in host RAM. RoPE's inv_freq, which older saves hold, is left out: model.py computes it."""
    from safetensors import safe_open  # only reading needs it
    index = os.path.join(path, 'model.safetensors.index.json')
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)['weight_map'].values()))
    elif os.path.isfile(os.path.join(path, 'model.safetensors')):
        files = ['model.safetensors']
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json "
                                f"(only safetensors checkpoints are supported)")
    state = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework='pt') as f:
            for key in f.keys():
                if not key.endswith('rotary_emb.inv_freq'):
                    keep = torch.float32 if key.rsplit('.', 1)[-1] in keep_fp32 else dtype
                    state[key] = f.get_tensor(key).to(device=device, dtype=keep)
    return state

