"""Export one of this repo's checkpoints as a Hugging Face model directory, for transformers,
lm-evaluation-harness and the hub:

    python export_hf.py --ckpt=out/affine_1b --out_dir=hf/affine_1b
    python export_hf.py --ckpt=out/softmax_1b/ckpt.pt --out_dir=hf/softmax_1b --dtype=bfloat16

A softmax model is a plain Llama (or Qwen2) that transformers loads without remote code; every other
variant ships this repository's network (CODE_PATHS) with an auto_map to hf_wrapper.py. The
directory appears only once transformers gives our logits and token ids. docs/export.md.
"""
import copy
import json
import os
import re
import shutil
import sys
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch

from lmkit.checkpoint import CKPT_NAME, CheckpointError, read_checkpoint
from configurator import Key, fail, parse
from lmkit.errors import RunError, run_script
from lmkit.files import made_dirs, write_json
from lmkit.loading import check_finished
from model import GPT
from lmkit.tokenizer import BYTES_PATTERN, gpt2_unicode_to_byte, load_tokenizer, tokenizer_info

HERE = os.path.dirname(os.path.abspath(__file__))
# what a non-softmax export ships (hf_wrapper.py: the entry; the others are what it imports)
# what an export of a variant ships
CODE_PATHS = ('attention_kernels.py', 'lmkit/hf_wrapper.py', 'model.py')
# what exports shipped beside them before lmkit/ (--overwrite)
EARLIER_CODE_FILES = ('checkpoint.py', 'files.py')
CODE_FILES = tuple(os.path.basename(path) for path in CODE_PATHS)
HF_TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                      'vocab.json', 'merges.txt')
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
# what the export's tokenizer must encode exactly as ours: scripts, accents, emoji, whitespace runs,
# digits, contractions
TOKENIZER_CHECK_TEXTS = ("Hello,   world! It's 2024; we've 1234567 items\u2014costing $3.50.\n\n",
                         "  Ünïcödé: naïve café, 你好世界, 🤖🚀\ttab\r\nCRLF   \n",
                         "Question: Which is a gas?\nAnswer: steam",
                         "THEY'RE LOUD'LL 'S 0.001 x=42*y  \n\n\n   trailing   ")

# -----------------------------------------------------------------------------
# Reading our checkpoint


def load_checkpoint(spec):
    """(GPT in eval mode, the checkpoint's tokenizer dict, its path) of train.py's ckpt.pt or the
    out_dir holding it."""
    path = os.path.join(spec, CKPT_NAME) if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise RunError(f"--ckpt={spec}: no such checkpoint (train.py's {CKPT_NAME}, or the out_dir "
                       "holding it)")
    try:
        return GPT.from_pretrained(path).eval(), read_checkpoint(path)['tokenizer'], path
    except CheckpointError as e:
        raise RunError(f"--ckpt={spec}: {e}") from None

# -----------------------------------------------------------------------------
# Weights


def parse_size(text):
    """'5GB', '500MB', '20KB' or a number of bytes (decimal units, as transformers' max_shard_size)
    -> bytes."""
    m = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*(KB|MB|GB|TB)?\s*', text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a size such as 5GB, 500MB or 20KB, got {text!r}")
    return int(float(m.group(1)) * 1000 ** ' KMGT'.index((m.group(2) or ' ')[0].upper()))


def export_state_dict(model, dtype):
    """A GPT's state dict in dtype, as transformers stores it: a tied lm_head once (as
    embed_tokens), and the variant's float32 buffers (Variant.fp32: affine's alpha_ma) kept float32,
    as model.py keeps them in every precision."""
    state = {}
    for key, t in model.state_dict().items():
        if key == 'lm_head.weight' and model.config.tie_embeddings:
            continue
        keep = t.is_floating_point() and key.rsplit('.', 1)[-1] not in model.config.variant.fp32
        state[key] = t.detach().to(dtype if keep else t.dtype).contiguous()
    return state


def write_safetensors(state, out_dir, max_shard_bytes):
    """model.safetensors, or shards model-0000i-of-0000n.safetensors + model.safetensors.index.json
    when the weights exceed max_shard_bytes (a tensor larger than that gets a shard of its own)."""
    from safetensors.torch import save_file
    shards, size = [{}], 0
    for key, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    if len(shards) == 1:
        save_file(state, os.path.join(out_dir, 'model.safetensors'), metadata={'format': 'pt'})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={'format': 'pt'})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(os.path.join(out_dir, 'model.safetensors.index.json'),
               dict(metadata=dict(total_size=total), weight_map=weight_map), indent=2)


# -----------------------------------------------------------------------------
# The tokenizer


def bytes_tokenizer_json(path):
    """tokenizer.json of our 'bytes' tokenizer for Hugging Face `tokenizers`: a byte-level BPE
    without merges, whose vocabulary is the 256 bytes (each spelt as GPT-2's printable character)
    with id = the byte, so every byte is one token with our id; <|endoftext|> = 256 after them. Laid
    out as Llama-3's (a Split regex, ours, then ByteLevel)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE(vocab=gpt2_unicode_to_byte(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(BYTES_PATTERN), behavior='isolated'),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken('<|endoftext|>', special=True)])
    tok.save(path)


def write_tokenizer(tok_info, override, out_dir, block_size):
    """The run's tokenizer as Hugging Face files in out_dir; returns our tiktoken Encoding of it,
    for the check. An HF tokenizer is copied from where the checkpoint records it (or `override`,
    where it is now) after checking by sha256 that it is the one the run trained with."""
    if tok_info['family'] == 'bytes':
        if override:
            raise RunError("--tokenizer: this run used the built-in bytes tokenizer; there is "
                           "nothing to pass")
        bytes_tokenizer_json(os.path.join(out_dir, 'tokenizer.json'))
        config = dict(eos_token='<|endoftext|>')
        enc = load_tokenizer('bytes')
    else:
        src = override or tok_info['spec']
        has_json = os.path.isfile(os.path.join(src, 'tokenizer.json'))
        has_bpe = all(os.path.isfile(os.path.join(src, name))
                      for name in ('vocab.json', 'merges.txt'))
        if not os.path.isdir(src) or not (has_json or has_bpe):
            raise RunError(f"the run's tokenizer ({tok_info['family']}, from {tok_info['spec']}) "
                           f"cannot be exported from {src}: transformers needs its Hugging Face "
                           "files (tokenizer.json, or vocab.json + merges.txt); pass "
                           "--tokenizer=<the teacher's Hugging Face directory>")
        enc = load_tokenizer(src)
        if tokenizer_info(enc, src)['sha256'] != tok_info['sha256']:
            raise RunError(f"--tokenizer: the tokenizer at {src} is not the one the run trained "
                           f"with (sha256 {tok_info['sha256'][:12]}...); pass --tokenizer=<the "
                           "teacher's Hugging Face directory>")
        for name in HF_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(src, name)):
                shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
        config = {}
        if os.path.isfile(os.path.join(src, 'tokenizer_config.json')):
            with open(os.path.join(src, 'tokenizer_config.json'), encoding='utf-8') as f:
                config = json.load(f)
        # transformers 5 saves tokenizer_class "TokenizersBackend" (4.x refuses it) and
        # extra_special_tokens as a list (4.x expects a dict): what both read
        if config.get('tokenizer_class') in (None, 'TokenizersBackend') and has_json:
            config['tokenizer_class'] = 'PreTrainedTokenizerFast'
        if isinstance(config.get('extra_special_tokens'), list):
            config.pop('extra_special_tokens')
    config.setdefault('tokenizer_class', 'PreTrainedTokenizerFast')
    # the model takes block_size tokens at most; padding after the tokens (see
    # hf_wrapper.seq_lens_from_mask)
    config.update(model_max_length=block_size, padding_side='right')
    config.setdefault('clean_up_tokenization_spaces', False)
    write_json(os.path.join(out_dir, 'tokenizer_config.json'), config, indent=2)
    return enc


def check_tokenizer(out_dir, enc):
    """The exported tokenizer, as transformers loads it, must give our ids; returns its bos/eos
    token ids."""
    from transformers import AutoTokenizer
    try:
        hf = AutoTokenizer.from_pretrained(out_dir)
    except Exception as e:
        raise RunError(f"the exported tokenizer does not load in transformers: {type(e).__name__}: "
                       f"{e}") from None
    for text in TOKENIZER_CHECK_TEXTS:
        ours, theirs = (enc.encode_ordinary(text),
                        hf(text, add_special_tokens=False, verbose=False)["input_ids"])
        if ours != theirs:
            raise RunError("the exported tokenizer gives other token ids than the run's for "
                           f"{text!r}: {theirs[:12]} vs {ours[:12]}")
    return dict(bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id)

# -----------------------------------------------------------------------------
# The check, and the command line


@torch.no_grad()
def check_logits(out_dir, model, dtype):
    """transformers' model from out_dir against ours, both float32 on the exported weights (a bf16
    export is compared with our model rounded to bf16): a right-padded batch, logits at the real
    positions. Returns the max difference."""
    from transformers import AutoModelForCausalLM
    from lmkit.hf_wrapper import hf_native
    # (alpha_ma stays float32 through the casts, as model.py keeps it)
    ours = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype).float()
    hf = AutoModelForCausalLM.from_pretrained(out_dir,
                                              trust_remote_code=not hf_native(model.config))
    # (transformers 5 loads a bf16 export in bf16, alpha_ma float32; 4.x in float32)
    hf = hf.float().eval()
    T = min(model.config.block_size, 16)
    idx = torch.randint(0, model.config.vocab_size, (2, T),
                        generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([T, max(1, T - 5)])
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    expected, _ = ours(idx, seq_lens=lens)
    got = hf(input_ids=idx, attention_mask=mask).logits
    real = mask.bool()
    err = (got[real] - expected[real]).abs().max().item()
    if not err <= 1e-4 * max(1.0, expected[real].abs().max().item()):  # (also catches NaN)
        raise RunError("the exported model's logits in transformers differ from ours by "
                       f"{err:.2e}: not exported")
    return err


def export(model, tok_info, out_dir, dtype=torch.float32, max_shard_bytes=5 * 1000 ** 3,
           tokenizer=None, check=True):
    """Write the Hugging Face directory of `model` (a GPT) into out_dir, atomically; out_dir must
    not exist, or be empty, or hold an earlier export to replace. Returns the check's max logit
    difference (None without the check)."""
    cfg = model.config
    out_dir = os.path.abspath(out_dir)
    parent, name = os.path.split(out_dir)
    tmp = os.path.join(parent, f'.{name}.export-{os.getpid()}')
    with made_dirs(parent):
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)
        try:
            enc = write_tokenizer(tok_info, tokenizer, tmp, cfg.block_size)
            special_ids = check_tokenizer(tmp, enc)
            # transformers: imported once main has checked it is there
            from lmkit.hf_wrapper import hf_config, hf_native
            write_json(os.path.join(tmp, 'config.json'),
                       hf_config(cfg, dtype, special_ids, tok_info), indent=2)
            generation = dict(special_ids, **({} if hf_native(cfg) else dict(use_cache=False)))
            write_json(os.path.join(tmp, 'generation_config.json'), generation, indent=2)
            if not hf_native(cfg):
                for path in CODE_PATHS:
                    shutil.copyfile(os.path.join(HERE, path),
                                    os.path.join(tmp, os.path.basename(path)))
            write_safetensors(export_state_dict(model, dtype), tmp, max_shard_bytes)
            # safetensors writes its files private (0600); give them the others' mode
            for file in os.listdir(tmp):
                if file.endswith('.safetensors'):
                    os.chmod(os.path.join(tmp, file),
                             os.stat(os.path.join(tmp, 'config.json')).st_mode & 0o777)
            err = check_logits(tmp, model, dtype) if check else None
            if os.path.isdir(out_dir):  # empty, or an earlier export the caller agreed to replace
                old = os.path.join(parent, f'.{name}.replaced-{os.getpid()}')
                os.replace(out_dir, old)
                os.replace(tmp, out_dir)
                shutil.rmtree(old)
            else:
                os.replace(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return err


def is_export_file(name):
    """Whether a file name is one an export writes."""
    return (name in CODE_FILES + EARLIER_CODE_FILES + HF_TOKENIZER_FILES
            + ('config.json', 'generation_config.json')
            or re.fullmatch(r'model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?',
                            name) is not None)


def is_export(path):
    """Whether a directory holds an earlier export of this script (its config.json records
    tokenizer_info)."""
    try:
        with open(os.path.join(path, 'config.json'), encoding='utf-8') as f:
            return 'tokenizer_info' in json.load(f)
    except (OSError, ValueError):
        return False


KEYS = dict(
    ckpt=Key(None, "train.py's ckpt.pt, or the out_dir holding it", types=(str,), required=True),
    out_dir=Key(None, "the directory to write (must not exist, or be empty)", types=(str,),
                required=True),
    dtype=Key('float32', "the weights' dtype (alpha_ma stays float32)", choices=tuple(DTYPES)),
    max_shard_size=Key('5GB', "shard the weights above this size (5GB, 500MB, 20KB or bytes)"),
    tokenizer=Key(None, "the teacher's Hugging Face directory, if it is no longer where the "
                        "checkpoint records it",
                  types=(str,)),
    overwrite=Key(False, "replace an earlier export in out_dir"),
    check=Key(True, "load the export in transformers and compare its logits with ours before it is "
                    "put in place"),
    allow_unfinished=Key(False, "export a checkpoint whose run has not reached its max_iters (a "
                                "stopped run's) as it is"),
)


def parse_args(argv):
    args = SimpleNamespace(**parse(argv, KEYS,
                                   "Export one of our checkpoints as a Hugging Face model "
                                   "directory.",
                                   prog='export_hf.py'))
    try:
        args.max_shard_size = parse_size(args.max_shard_size)
    except ValueError as e:
        fail(f"--max_shard_size={args.max_shard_size}: {e}")
    if args.max_shard_size < 1:  # 0 wrote one shard per tensor
        fail(f"--max_shard_size={args.max_shard_size} is out of range: must be > 0 bytes")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:  # not in requirements.txt: only exporting (and the tests) need them
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise RunError("export_hf.py needs transformers and tokenizers (pip install transformers): "
                       f"{e}") from None
    out = args.out_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise RunError(f"--out_dir={out}: is a file")
    if os.path.isdir(out) and os.listdir(out) and not (args.overwrite and is_export(out)):
        held = ', '.join(sorted(os.listdir(out))[:5])
        hint = "; pass --overwrite=True to replace that earlier export" if is_export(out) else ""
        raise RunError(f"--out_dir={out}: already holds files ({held}); choose another "
                       f"directory{hint}")
    # the earlier export is replaced whole: only if every file in it is one an export writes
    if foreign := [name for name in sorted(os.listdir(out))
                   if not is_export_file(name)] if os.path.isdir(out) else []:
        raise RunError(f"--out_dir={out}: the earlier export there also holds files an export does "
                       f"not write ({', '.join(foreign[:5])}), which replacing it would delete; "
                       "move them out first")
    model, tok_info, path = load_checkpoint(args.ckpt)
    check_finished(path, args.allow_unfinished, '--allow_unfinished=True')
    err = export(model, tok_info, out, DTYPES[args.dtype], args.max_shard_size, args.tokenizer,
                 args.check)
    from lmkit.hf_wrapper import hf_native  # (transformers is there: the export checked it)
    cfg = model.config
    how = ("AutoModelForCausalLM.from_pretrained(DIR)" if hf_native(cfg) else
           "AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)")
    checked = (f"; transformers gives our logits (max difference {err:.1e})" if err is not None
               else "")
    print(f"exported {path} ({cfg.attention}, {model.get_num_params():,} parameters, {args.dtype}) "
          f"to {out}: load it with {how}{checked}")
    return out


if __name__ == '__main__':
    run_script(main)
