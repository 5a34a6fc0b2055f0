"""
What the scripts need to load a model beside GPT.from_pretrained (lmkit/pretrained.py):
load_model_and_tokenizer gives a model with the tokenizer it was trained with, checked by its
sha256; window_first_token gives the token its training windows started with; check_finished
refuses a checkpoint whose run stopped early. sample.py, analyze.py, eval_zeroshot.py, export_hf.py
and tools/bench.py load through it.
"""
import os
import sys

from lmkit.checkpoint import checkpoint_file, read_checkpoint
from lmkit.data import first_token_id
from lmkit.errors import RunError
from lmkit.runs import recorded_config, run_config
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from model import GPT


def check_finished(spec, allowed, flag):
    """A RunError where spec is one of our checkpoints whose run stopped before its max_iters (a
    stopped train.py saves the step it reached, and exits non-zero: a chain that goes on anyway
    would score or ship a part-trained model as the run's), unless `allowed` (`flag` said so); then
    a note on stderr. A Hugging Face directory, an export or a model saved alone records no
    max_iters: nothing is said."""
    path = checkpoint_file(spec)
    ckpt = read_checkpoint(path, keys=()) if path else {}
    config = ckpt.get('config') or {}
    if 'max_iters' in recorded_config(config)[1]:  # no run: a model saved alone, or no checkpoint
        return
    step, max_iters = ckpt['step'], run_config(config).max_iters
    if step >= max_iters:
        return
    unfinished = (f"{path} holds step {step:,} of its run's max_iters={max_iters:,}: the run has "
                  "not finished")
    if not allowed:
        raise RunError(f"{unfinished}; continue it with the train.py command that started it (it "
                       f"continues from this checkpoint), or pass {flag} to use it as it is")
    print(f"note: {unfinished}; used as it is ({flag})", file=sys.stderr)


def window_first_token(spec):
    """The token a checkpoint's training windows all started with (train.py's first_token='prefix'),
    which every reader puts first too: None for a Hugging Face directory or a run with the default
    windows."""
    path = checkpoint_file(spec)
    if path is None:
        return None
    ckpt = read_checkpoint(path, keys=('tokenizer',))
    # (a checkpoint of a model alone has no config: the defaults)
    config = run_config(ckpt.get('config', {}))
    return first_token_id(config.first_token, ckpt['tokenizer'])


def load_model_and_tokenizer(spec, tokenizer, device, dtype):
    """(model, tokenizer) of a checkpoint spec: a Hugging Face directory's own tokenizer files, or
    the tokenizer recorded in one of our checkpoints, rebuilt from its spec (or from `tokenizer`,
    where it is now) and checked by its sha256 to be the one the model was trained with."""
    try:
        model = GPT.from_pretrained(spec, dtype=dtype, device=device).eval()
    except (OSError, ValueError, RuntimeError) as e:  # unreadable, unsupported, does not fit
        raise RunError(f"model {spec}: {e}") from e
    path = checkpoint_file(spec)
    if path is None:
        return model, load_tokenizer(tokenizer or spec)
    info = read_checkpoint(path)['tokenizer']
    tok_spec = tokenizer or info['spec']
    if tok_spec != 'bytes' and not os.path.exists(tok_spec):
        raise RunError(f"{path}: its tokenizer {tok_spec} is gone; pass --tokenizer=<where it is "
                       "now>")
    enc = load_tokenizer(tok_spec)
    if tokenizer_info(enc, tok_spec)['sha256'] != info['sha256']:
        # a record without 'boundary' predates reading tokenizers from their own files: if the files
        # are unchanged, the data was tokenized with conventions guessed from config.json that
        # differ from the files'
        older = '' if 'boundary' in info else (
            f"; it was recorded by an older prepare_data.py, which inferred the {info['family']} "
            f"conventions from config.json where this one reads {enc.name} ones from the "
            "tokenizer's files: if those files are the same, prepare the data again and retrain")
        raise RunError(f"{path}: the tokenizer at {tok_spec} is not the one the model was trained "
                       f"with (sha256 {info['sha256'][:12]}...); pass --tokenizer=<the right "
                       f"one>{older}")
    return model, enc
