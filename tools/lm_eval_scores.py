"""lm-evaluation-harness 0.4.9's log-likelihoods of (context, continuation) pairs, timed in its own
process: run by tools/bench.py's harness section with the Python of an environment where lm_eval
imports (0.4.9 needs transformers 4, this repository transformers 5); tests/test_smollm2.py imports
loglikelihoods where lm_eval imports.

    <env>/bin/python -m tools.lm_eval_scores MODEL_DIR PAIRS.json BATCH_SIZE DTYPE DEVICE OUT.json

PAIRS.json: [[context, continuation], ...]. OUT.json: {"logliks": [...], "seconds": the
loglikelihood call's}. HFLM is what `lm_eval --model hf` runs (lm_eval/models/huggingface.py).
"""
import json
import sys
import time


def loglikelihoods(model_dir, pairs, batch_size, dtype, device):
    """(the log-likelihood of each (context, continuation) pair, the seconds HFLM.loglikelihood
    took)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=model_dir, batch_size=int(batch_size), device=device, dtype=dtype)
    instances = [Instance(request_type='loglikelihood', doc={}, arguments=tuple(pair), idx=i)
                 for i, pair in enumerate(pairs)]
    t0 = time.perf_counter()
    logliks = [loglik for loglik, _ in lm.loglikelihood(instances, disable_tqdm=True)]
    return logliks, time.perf_counter() - t0


def main(model_dir, pairs_path, batch_size, dtype, device, out_path):
    with open(pairs_path, encoding='utf-8') as f:
        logliks, seconds = loglikelihoods(model_dir, json.load(f), batch_size, dtype, device)
    with open(out_path, 'w', encoding='utf-8') as f:
        json.dump(dict(logliks=logliks, seconds=seconds), f)


def cli(argv):
    """The command line: its six arguments, or --help (the docstring); anything else is the usage
    line and exit status 2, where main(*argv) raised a TypeError."""
    if argv in (['-h'], ['--help']):
        print(__doc__.strip())
        return
    if len(argv) != 6:
        sys.exit(f"usage: {USAGE}\n(got {len(argv)} arguments; --help says what each is)")
    main(*argv)


USAGE = 'python -m tools.lm_eval_scores MODEL_DIR PAIRS.json BATCH_SIZE DTYPE DEVICE OUT.json'

if __name__ == '__main__':
    cli(sys.argv[1:])
