"""Sample text from a trained model, as nanoGPT's sample.py: any attention variant, from a train.py
out_dir or its ckpt.pt, a directory export_hf.py wrote, or a Hugging Face Llama / Mistral / Qwen2
directory. Each sample is printed decoded, then a line of dashes. docs/implementation.md,
"Generation", has the prompt, the tokenizer and the flags.

    python sample.py --ckpt=out/quickstart/affine_seed0                      # a quick-start student
    python sample.py --ckpt=out/tiny_cpu --start="def " --num_samples=3 --max_new_tokens=200
    python sample.py --ckpt=out/affine_1b/ckpt.pt --start=FILE:prompt.txt --temperature=0  # greedy
    python sample.py --ckpt=checkpoints/SmolLM2-360M --start="The capital of France is" --top_k=50
"""
import os
import sys
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch

from lmkit.distributed import resolve_device, resolve_dtype
from configurator import DEVICE, Key, parse
# the model and its tokenizer as every reader of a checkpoint gets them: sample.py imports no
# tokenizer code itself
from lmkit.loading import load_model_and_tokenizer, window_first_token
from lmkit.errors import RunError, run_script

FILE_PREFIX = 'FILE:'
SEPARATOR = '---------------'

KEYS = dict(
    ckpt=Key(None, "a train.py out_dir or its ckpt.pt, an export_hf.py directory, or a Hugging "
                   "Face model directory",
             types=(str,), required=True),
    start=Key(None, "the text to continue, or FILE:path (default: a newline, or the windows' first "
                    "token)",
              types=(str,)),
    num_samples=Key(10, "samples to draw, one after the other", min=1),
    max_new_tokens=Key(500, "tokens generated per sample", min=1),
    temperature=Key(0.8, "1.0: the model's distribution; below 1 less random; 0: greedy",
                    min=0, max=100),
    top_k=Key(200, "sample from the k most likely tokens only (None: from all)", types=(int,),
              min=1),
    seed=Key(1337, "torch's seed: the same seed gives the same samples; at most 2**64 - 1, the "
                   "largest torch.manual_seed takes", min=0, max=2 ** 64 - 1),
    device=DEVICE,
    dtype=Key('auto', "auto: bfloat16 on GPUs that support it, else float32",
              choices=('auto', 'float32', 'bfloat16', 'float16')),
    tokenizer=Key(None, "where the checkpoint's tokenizer is now, if it moved (default: the path "
                        "it records)",
                  types=(str,)),
)


def parse_args(argv):
    return SimpleNamespace(**parse(argv, KEYS, "Sample text from a trained model (any variant).",
                                   prog='sample.py'))


def start_text(start):
    """--start's text: as given, or a file's contents for FILE:path; None stays None (the
    default)."""
    if start is None or not start.startswith(FILE_PREFIX):
        return start
    path = start[len(FILE_PREFIX):]
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except OSError as e:
        raise RunError(f"--start={start}: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RunError(f"--start={start}: {path} is not UTF-8 text ({e.reason} at byte "
                       f"{e.start})") from None


def prompt_ids(enc, start, text, first):
    """(ids before the text, ids of the text): what starts every sample. first: the token the
    model's training windows began with (or None); else the tokenizer's own prefix (the BOS it puts
    before a text, if any)."""
    before = [first] if first is not None else enc.ids(enc.prefix)
    if text is None:
        text = '' if before else '\n'
    ids = enc.encode_ordinary(text)
    if not before and not ids:
        raise RunError(f"--start={start}: an empty prompt, and this model has no start token to "
                       "begin with; give some text")
    return before, ids


def decode(enc, ids):
    """The text of token ids. An id the tokenizer does not know (a model's vocabulary is usually
    padded past the tokenizer's: train.py's vocab_size) is shown as <|id N|>; bytes that are not
    UTF-8 as U+FFFD."""
    pieces = []
    for token in ids:
        try:
            pieces.append(enc.decode_single_token_bytes(token))
        except KeyError:
            pieces.append(f'<|id {token}|>'.encode())
    return b''.join(pieces).decode('utf-8', errors='replace')


def main(argv=None):
    """Print args.num_samples samples; return them as lists of token ids (the prompt's text, then
    the new tokens; the start token, if any, left out)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    text = start_text(args.start)  # a file that cannot be read stops before the model is loaded
    device = resolve_device(args.device)
    dtype = getattr(torch, resolve_dtype(args.dtype, device))
    model, enc = load_model_and_tokenizer(args.ckpt, args.tokenizer, device, dtype)
    before, ids = prompt_ids(enc, args.start, text, window_first_token(args.ckpt))
    cfg = model.config
    how = ('recomputing the window each step (its outputs depend on the sequence length)'
           if cfg.outputs_depend_on_length else 'KV cache')
    gate = '' if cfg.gate == 'none' else f' with the {cfg.gate} gate'  # beside its attention
    print(f"sample.py: {args.ckpt}: attention={cfg.attention}{gate}, "
          f"{cfg.n_layer} layers, block_size {cfg.block_size}, {how}; tokenizer {enc.name}; "
          f"{dtype} on {device}", file=sys.stderr)
    torch.manual_seed(args.seed)
    x = torch.tensor([before + ids], dtype=torch.long, device=device)
    samples = []
    for _ in range(args.num_samples):
        y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
        tokens = y[0, len(before):].tolist()
        print(decode(enc, tokens))
        print(SEPARATOR, flush=True)
        samples.append(tokens)
    return samples


if __name__ == '__main__':
    run_script(main)
