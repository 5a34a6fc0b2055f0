"""Zero-shot evaluation as in the paper's Tables 1-3: accuracy on ARC-Easy/Challenge, HellaSwag,
PIQA, BoolQ and WinoGrande computed exactly as lm-evaluation-harness v0.4.9 does (without installing
it; lmkit/zeroshot.py, and docs/evaluation.md for the rules), and C4 perplexity.

    python eval_zeroshot.py --ckpt=out/ckpt.pt                       # six tasks + c4, from the hub
    python eval_zeroshot.py --hf_model=checkpoints/Llama-3.2-1B --tasks=hellaswag,piqa --limit=200
    python eval_zeroshot.py --ckpt=out/tiny --tasks=heldout          # CPU quick start, offline
    python eval_zeroshot.py --export_data=evaldata                   # with internet, then
    python eval_zeroshot.py --ckpt=out/ckpt.pt --data_dir=evaldata   # offline
"""
import json
import os
import sys
import time
from contextlib import nullcontext
from types import SimpleNamespace

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # before torch: idle OpenMP threads sleep
import torch

from configurator import DEVICE, Key, fail, parse
from lmkit.distributed import resolve_device, resolve_dtype
from lmkit.errors import RunError, run_script
from lmkit.data import read_meta
from lmkit.files import made_dirs, write_json
from lmkit.progress import Progress
from lmkit.loading import check_finished, load_model_and_tokenizer, window_first_token
from lmkit.zeroshot import (C4_DOCS, C4_SHARD, DEFAULT_TASKS, TASKS, build_docs, c4_perplexity,
                            c4_tokens, check_task_files, encode_docs, export_data, heldout_rows,
                            read_rows, score_one_by_one, score_requests, task_metrics)


KEYS = dict(
    ckpt=Key(None, "one of this repo's checkpoints (ckpt.pt or its out_dir)", types=(str,)),
    hf_model=Key(None, "a Hugging Face Llama / Mistral / Qwen2 checkpoint directory", types=(str,)),
    tasks=Key(list(DEFAULT_TASKS), "comma-separated", choices=tuple(TASKS), unique=True),
    limit=Key(None, "only the first N documents of each task", types=(int,), min=1),
    batch_size=Key(32, "sequences per forward pass", min=1),
    device=DEVICE,
    dtype=Key('auto', "auto: bfloat16 on GPUs that support it, else float32",
              choices=('auto', 'float32', 'bfloat16', 'float16')),
    data_dir=Key(None, "read <task>/<split>.jsonl from here instead of the hub", types=(str,)),
    export_data=Key(None, "write the tasks' data from the hub to this directory, exit",
                    types=(str,)),
    out=Key(None, "write the results as JSON here", types=(str,)),
    log_samples=Key(False, "per-document logliks/pred/gold in --out"),
    add_bos=Key(False, "prepend BOS to every context (v0.4.9: off)"),
    max_length=Key(0, "left-truncation length (0: the model's block_size)", min=0),
    tokenizer=Key(None, "override the tokenizer spec a checkpoint records", types=(str,)),
    c4_windows=Key(256, "c4: number of windows", min=1),
    c4_seqlen=Key(0, "c4: tokens per window (0: min(2048, max_length))", min=0),
    heldout_data=Key('data/builtin_bytes', "heldout: a prepare_data.py output dir"),
    heldout_docs=Key(100, "heldout: number of documents", min=2),
    one_by_one=Key(False, "score with the one-request-per-forward reference loop (for timing "
                          "comparisons)"),
    allow_unfinished=Key(False, "evaluate a --ckpt whose run has not reached its max_iters (a "
                                "stopped run's) as it is"),
)


def is_eval_result(path):
    """Whether path holds results that --out wrote: a JSON object of tasks' results."""
    try:
        with open(path, encoding='utf-8') as f:
            results = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(results, dict) and all(task in TASKS and isinstance(r, dict)
                                             for task, r in results.items())


def parse_args(argv):
    args = SimpleNamespace(**parse(argv, KEYS,
                                   "Zero-shot accuracy as lm-evaluation-harness v0.4.9 computes "
                                   "it, and C4 perplexity.",
                                   prog='eval_zeroshot.py'))
    if args.export_data is None and (args.ckpt is None) == (args.hf_model is None):
        fail("give exactly one of --ckpt and --hf_model")
    return args


def evaluate(args, device):
    """Every task of args.tasks on the model of args.ckpt / args.hf_model: {task: its results}."""
    dtype = getattr(torch, resolve_dtype(args.dtype, device))
    model, enc = load_model_and_tokenizer(args.hf_model or args.ckpt, args.tokenizer, device, dtype)
    if args.ckpt:  # (a file that is no checkpoint: said by the loading, as for every reader)
        check_finished(args.ckpt, args.allow_unfinished, '--allow_unfinished=True')
    cfg = model.config
    # HFLM: the user's max_length, else the model's positions
    max_length = args.max_length or cfg.block_size
    # the tokenizer's own conventions, read from its files (tokenizer.Tokenizer): the BOS it puts
    # before a text (add_special_tokens=True, what --add_bos asks the harness for), and the
    # harness's prefix token for an empty context (TemplateLM._encode_pair: the tokenizer's BOS,
    # else its EOS)
    bos_id = enc.ids(enc.prefix)[0] if enc.prefix else None
    if args.add_bos and bos_id is None:
        raise RunError(f"--add_bos: the {enc.name} tokenizer puts no BOS before a text (its HF "
                       "tokenizer adds none either)")
    if args.add_bos and enc.suffix:
        raise RunError(f"--add_bos: this tokenizer also puts {', '.join(enc.suffix)} after every "
                       "text, which the harness would then put after each context; that is not "
                       "reproduced")
    prefix_id = enc.ids([enc.prefix_token])[0] if enc.prefix_token is not None else None
    # trained with it first: every context starts so
    first = window_first_token(args.ckpt) if args.ckpt else None
    before = first if first is not None else bos_id if args.add_bos else None
    print(f"model {args.hf_model or args.ckpt}: {cfg.attention}, {cfg.n_layer} layers, max_length "
          f"{max_length}, tokenizer {enc.name}, BOS {'on' if args.add_bos else 'off'}"
          f"{'' if first is None else f', token {first} first (as its training windows)'}, "
          f"{dtype} on {device}", file=sys.stderr)
    results = {}
    for task in args.tasks:
        t0 = time.time()
        if task == 'c4':
            rows, where = read_rows(task, args.data_dir, C4_DOCS)
            ids, seqlen = c4_tokens(enc, rows, where), args.c4_seqlen or min(2048, max_length)
            r = c4_perplexity(model, ids, args.c4_windows, seqlen, args.batch_size,
                              Progress('c4 windows', min(args.c4_windows, len(ids) // seqlen)),
                              first)
            r['protocol'] = (f"c4-new (GPTQ --new-eval): first {C4_DOCS} docs of {C4_SHARD} joined "
                             f"by ' ', {''.join(t + ' + ' for t in enc.prefix)}tokenized "
                             f"once{''.join(' + ' + t for t in enc.suffix)}, {r['n']} windows of "
                             f"{seqlen} tokens from the start, PPL = exp(mean of per-window mean "
                             "NLL)")
            print(r['protocol'], file=sys.stderr)
            results[task] = r
            continue
        if task == 'heldout':
            rows, where = heldout_rows(args.heldout_data,
                                       args.heldout_docs)[:args.limit], args.heldout_data
        else:
            rows, where = read_rows(task, args.data_dir, args.limit)
        docs = build_docs(task, rows, where)
        requests = encode_docs(task, docs, enc, max_length, before, prefix_id)
        if args.one_by_one:
            logliks = score_one_by_one(model, requests, Progress(f"{task} requests", len(requests)))
        else:  # each document's context once (where the model allows it: score_requests)
            documents = [d for d, doc in enumerate(docs) for _ in doc.requests]
            logliks = score_requests(model, requests, args.batch_size,
                                     Progress(f"{task} documents", len(docs)), documents)
        results[task] = task_metrics(docs, logliks, args.log_samples)
        print(f"{task}: {len(docs)} docs in {time.time() - t0:.1f} s "
              f"({len(docs) / (time.time() - t0):.1f} docs/s)",
              file=sys.stderr)
    return results


def print_results(results):
    """The results as a table on stdout."""
    print(f"{'task':<14} {'n':>6} {'acc':>7} {'acc_norm':>9} {'stderr':>7}")
    for task, r in results.items():
        if task == 'c4':
            print(f"{task:<14} {r['n']:>6} ppl {r['ppl']:.3f} ({r['n']} x {r['seqlen']} tokens, "
                  "c4-new)")
            continue
        norm = f"{r['acc_norm']:.4f}" if r['acc_norm'] is not None else '-'
        stderr = f"{r['acc_stderr']:.4f}" if r['acc_stderr'] is not None else '-'
        print(f"{task:<14} {r['n']:>6} {r['acc']:>7.4f} {norm:>9} {stderr:>7}")


def check_inputs(args):
    """Everything the tasks will read, before the model is loaded and any task scored: each task's
    file in --data_dir, and the held-out task's data."""
    if args.data_dir is not None:
        check_task_files([t for t in args.tasks if t != 'heldout'], args.data_dir)
    if 'heldout' in args.tasks:
        read_meta(args.heldout_data)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.export_data:
        return export_data(args.export_data, [t for t in args.tasks if t != 'heldout'])
    # (it said "holds something else than an earlier result")
    if args.out and os.path.isdir(args.out):
        raise RunError(f"--out={args.out}: is a directory; --out is the JSON file this run writes, "
                       f"e.g. --out={os.path.join(args.out, 'eval.json')}")
    if args.out and os.path.exists(args.out) and not is_eval_result(args.out):
        raise RunError(f"--out={args.out}: holds something else than an earlier result of "
                       "eval_zeroshot.py, which this run would write over; give another path")
    device = resolve_device(args.device)
    check_inputs(args)
    # --out's directory now, not after the evaluation: a path that cannot be written stops before
    # any work (and is removed again if the run fails)
    with made_dirs(os.path.dirname(os.path.abspath(args.out))) if args.out else nullcontext():
        results = evaluate(args, device)
        if args.out:  # before the table: a reader of stdout that has gone (| head) loses nothing
            write_json(args.out, results)
    print_results(results)
    return results


if __name__ == '__main__':
    run_script(main)
