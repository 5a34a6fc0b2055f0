"""Tests for eval_zeroshot.py: the exact context/continuation strings of hand-written rows of each
task's schema (lm-evaluation-harness v0.4.9's task YAMLs), the harness's tokenisation
(TemplateLM._encode_pair), acc/acc_norm and their tie-breaking (ConfigurableTask.process_results),
batched scoring against a one-request-per-forward loop and the model's own loss for every attention
variant, C4 windowing (GPTQ's c4-new), the heldout task, every bad-input error and the command
line."""
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval_zeroshot
from lmkit import zeroshot as ez
from prepare_data import write_shard
from lmkit.tokenizer import load_tokenizer, tokenizer_info
from lmkit.errors import RunError
from model import ATTENTIONS, GPT, IGNORE_INDEX, ModelConfig
from helpers import EOT, ROOT, TASK_ROWS, write_task_data, write_tiktoken_file

torch.set_num_threads(2)
BYTES = load_tokenizer('bytes')


def test_task_strings():
    """The task YAMLs' strings: every task's requests, gold and acc_norm lengths, character for
    character."""
    docs = {task: ez.DOC_BUILDERS[task](row) for task, row in TASK_ROWS.items()}
    assert docs['arc_easy'] == ez.Doc([('Question: Which is a gas?\nAnswer:', ' ' + c)
                                       for c in ['ice', 'steam', 'rock']], 1, [3.0, 5.0, 4.0])
    assert docs['arc_challenge'].gold == 3
    # capitalize() lower-cases the rest of ctx_b; " [title]" -> ". " then "  " -> " "; strip first,
    # so " [step] " leaves a trailing space; three spaces become two
    assert docs['hellaswag'] == ez.Doc(
        [('Roof shingle removal: A man is sitting on a roof. He starts pulling up roofing.. '
          'then', ' ' + e)
         for e in ['uses a ladder ', 'a b  c', 'x. y', 'plain.']], 2, [14.0, 6.0, 4.0, 6.0])
    assert docs['piqa'] == ez.Doc([('Question: How do I boil water?\nAnswer:', ' Heat it.'),
                                   ('Question: How do I boil water?\nAnswer:', ' Freeze it.')], 0,
                                  [8.0, 10.0])
    assert docs['boolq'] == ez.Doc([('The sky is blue.\nQuestion: is the sky '
                                     'blue?\nAnswer:', ' no'),
                                    ('The sky is blue.\nQuestion: is the sky blue?\nAnswer:',
                                     ' yes')], 1, None)
    # partial scoring: contexts end with the option, the shared continuation is what follows the
    # first "_"
    assert docs['winogrande'] == ez.Doc([("The cup didn't fit in the box because the "
                                          "cup", ' was too big. Really _.'),
                                         ("The cup didn't fit in the box because the box",
                                          ' was too big. Really _.')],
                                        0, None)
    # strip, then the rest
    assert ez.hellaswag_preprocess(' [header] Go  [title] now   ok ') == ' Go . now  ok'
    assert ez.choice_doc('c', ['é', 'ab'], 0).lengths == [1.0, 2.0]  # characters, not bytes


@pytest.fixture(scope='module')
def bpe(tmp_path_factory):
    """A Llama-3-convention tokenizer whose only merges are "ab" then "bc": joint encoding shows."""
    path = tmp_path_factory.mktemp('tok') / 'tokenizer.model'
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b'ab': 256, b'bc': 257})
    write_tiktoken_file(path, ranks)
    return load_tokenizer(str(path))


def test_encoding(bpe):
    ids = lambda s: list(s.encode())
    # TemplateLM._encode_pair: trailing whitespace of the context moves to the continuation
    assert ez.encode_request(BYTES, 'Answer: ', ' yes', 100) == (tuple(ids('Answer:  '
                                                                           'ye')),
                                                                 tuple(ids('  yes')))
    # joint encoding: continuation = whole[len(enc(ctx)):], not enc(continuation)
    x, a, c, d = (ord(ch) for ch in 'xacd')
    # (the input is enc(ctx) + that, not the joint encoding: "xa" + "cd" although "xabcd" encodes as
    # x ab c d)
    assert bpe.encode_ordinary('xabcd') == [x, 256, c, d] and bpe.encode_ordinary('bcd') == [257, d]
    assert ez.encode_request(bpe, 'xa', 'bcd', 100) == ((x, a, c), (c, d))
    bos = bpe.encode_single_token('<|begin_of_text|>')
    assert ez.encode_request(bpe, 'xa', 'bcd', 100, bos_id=bos) == ((bos, x, a, c), (c, d))
    assert ez.encode_request(BYTES, '', 'ab', 100, prefix_id=256) == ((256, ord('a')),
                                                                      tuple(ids('ab')))
    # left truncation: the last max_length + 1 tokens, minus the final one
    assert ez.encode_request(BYTES, 'abcdefgh', ' xy', 5) == (tuple(ids('fgh '
                                                                        'x')), tuple(ids(' xy')))
    with pytest.raises(ValueError, match='longer than max_length=2'):
        ez.encode_request(BYTES, 'abc', ' xy', 2)
    with pytest.raises(RunError, match=r'piqa: row 1: .*longer than max_length'):
        ez.encode_docs('piqa',
                       [ez.piqa_doc(TASK_ROWS['piqa']),
                        ez.piqa_doc(dict(TASK_ROWS['piqa'], sol2='y' * 50))],
                       BYTES, 20)


def test_metrics_tie_breaking():
    docs = [ez.Doc([None] * 3, 1, [2.0, 2.0, 3.0]), ez.Doc([None] * 2, 1, [1.0, 3.0]),
            ez.Doc([None] * 2, 0, None)]
    r = ez.task_metrics(docs, [-4.0, -4.0, -6.0, -4.0, -3.0, -1.0, -1.0], log_samples=True)
    # doc 0: ties -> first index for acc (0) and acc_norm (-2, -2, -2 -> 0); doc 1: both 1; doc 2: a
    # tie -> 0
    assert [d['pred'] for d in r['docs']] == [0, 1, 0]
    assert r['acc'] == pytest.approx(2 / 3) and r['acc_norm'] == 0.5 and r['n'] == 3
    assert r['acc_stderr'] == pytest.approx(statistics.stdev([0, 1, 1]) / math.sqrt(3))
    assert r['docs'][1] == dict(doc_index=1, logliks=[-4.0, -3.0], pred=1, gold=1)
    assert ez.task_metrics(docs[2:], [-1.0, -2.0])['acc_norm'] is None


def tiny_model(attention='softmax', bias_norm='seq_len', dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, intermediate_size=64,
                      vocab_size=257,
                      block_size=64, attention=attention, affine_bias_norm=bias_norm)
    model = GPT(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            # far from init, so that every term shows in the logits
            p.add_(torch.randn_like(p) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith('alpha_ma'):
                b.uniform_(0.2, 0.8)
    return model


def random_requests(seed=0, n=24):
    """Varied lengths, shared contexts, identical inputs, and inputs that are prefixes of others."""
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for _ in range(n // 3):
        ctx = torch.randint(0, 257, (int(torch.randint(1, 40, (1,), generator=g)),),
                            generator=g).tolist()
        for _ in range(2):
            cont = torch.randint(0, 257, (int(torch.randint(1, 6, (1,), generator=g)),),
                                 generator=g).tolist()
            reqs.append((tuple(ctx + cont)[:-1], tuple(cont)))
        reqs.append((reqs[-1][0][:-1], reqs[-1][0][-1:]))  # a prefix of the previous input
    # an identical request; identical input, other target
    return reqs + [reqs[0], (reqs[1][0], reqs[1][0][-1:])]


@pytest.mark.parametrize('attention,bias_norm',
                         [('softmax', 'seq_len'), ('sink', 'seq_len'), ('gated', 'seq_len'),
                          ('affine', 'seq_len'), ('affine_gated', 'seq_len'),
                          ('affine', 'visible')])
def test_batched_equals_one_by_one(attention, bias_norm):
    """Padding, batching, deduplication and prefix sharing change no score, for every variant: with
    affine's seq_len, N must be each sequence's own length and prefixes must not be shared."""
    model, reqs = tiny_model(attention, bias_norm), random_requests()
    reference = ez.score_one_by_one(model, reqs)
    for batch_size in (1, 5, 64):
        assert ez.score_requests(model, reqs, batch_size) == pytest.approx(reference, rel=1e-10,
                                                                           abs=1e-10)
    # one forward per distinct input; with prefix sharing, only per input that is no other's proper
    # prefix
    inputs = {inp for inp, _ in reqs}
    longest = {a for a in inputs if not any(len(b) > len(a) and b[:len(a)] == a for b in inputs)}
    share = not model.config.outputs_depend_on_length
    assert share == (attention not in ('affine', 'affine_gated') or bias_norm == 'visible')
    assert len(set(ez.plan_forwards(reqs, share))) == len(longest if share else inputs) < len(reqs)


def documents(seed=0, n=14, max_length=64):
    """(requests, each one's document): contexts of 1-100 tokens (past max_length, left-truncated as
    the harness does: encode_request), 1-4 choices of 1-8 tokens, one of them a second copy of
    another; the last document a copy of the first."""
    g = torch.Generator().manual_seed(seed)
    randint = lambda low, high, n=None: torch.randint(low, high, (n,) if n else (1,),
                                                      generator=g).tolist()
    requests, docs = [], []
    for d in range(n):
        context = randint(0, 257, randint(1, 101)[0])
        choices = [randint(0, 257, randint(1, 9)[0]) for _ in range(randint(1, 5)[0])]
        for cont in choices + choices[:1] * (d % 3 == 0):
            requests.append((tuple(context + cont)[-(max_length + 1):][:-1], tuple(cont)))
            docs.append(d)
    first = docs.count(0)
    return requests + requests[:first], docs + [n] * first


@pytest.mark.parametrize('attention,bias_norm', [(a, 'seq_len') for a in ATTENTIONS]
                         + [('affine', 'visible'),
                                                                                          (
    'affine_gated', 'visible')])
def test_each_documents_context_once_scores_as_one_by_one(attention, bias_norm):
    """score_requests with documents: each document's shared context computed once, its choices
    against the KV cache, for every variant of the registry: the scores of score_one_by_one (one
    whole forward per request), in float64, at batch sizes that split documents and choices across
    batches; contexts longer than block_size truncated as the harness truncates. Fewer tokens go
    through the model, except where outputs depend on the call's length (affine, seq_len), which
    scores whole inputs (and shares none of their prefixes)."""
    model, (requests, docs) = tiny_model(attention, bias_norm), documents()
    reference = ez.score_one_by_one(model, requests)
    tokens = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args,
                                                          out: tokens.append(args[0].numel()))
    for batch_size in (1, 3, 64):
        tokens.clear()
        assert ez.score_requests(model, requests, batch_size,
                                 groups=docs) == pytest.approx(reference, rel=1e-10,
                                                                                           abs=1e-10)
        whole = sum(len(requests[o][0]) for o in set(ez.plan_forwards(requests, True)))
        if model.config.outputs_depend_on_length:
            assert batch_size > 1 or sum(tokens) == sum(map(len, {inp for inp, _ in requests}))
        elif batch_size == 1:  # no padding: each context once
            assert sum(tokens) < 0.7 * whole
    hook.remove()


def test_scores_equal_the_models_own_loss():
    """Sum of continuation log-probs = -(mean cross-entropy over the continuation targets) x their
    number."""
    model, reqs = tiny_model('affine', dtype=torch.float32), random_requests(seed=1)
    scores = ez.score_requests(model, reqs, 4)
    for (inp, cont), score in zip(reqs, scores):
        # row t predicts token t + 1
        targets = torch.tensor([IGNORE_INDEX] * (len(inp) - len(cont)) + list(cont))
        with torch.no_grad():
            _, loss = model(torch.tensor([inp]), targets=targets[None])
        assert score == pytest.approx(-loss.item() * len(cont), rel=1e-4, abs=1e-4)


def test_c4_windows(bpe):
    rows = [dict(text=f'document {i} says hello.') for i in range(ez.C4_DOCS + 5)]
    text = ' '.join(r['text'] for r in rows[:ez.C4_DOCS])
    # first 1100 docs, one space, no BOS for bytes
    assert ez.c4_tokens(BYTES, rows) == list(text.encode())
    # Llama-3: one BOS at the start
    assert ez.c4_tokens(bpe, rows)[0] == bpe.encode_single_token('<|begin_of_text|>')
    with pytest.raises(RunError, match='needs the first 1100'):
        ez.c4_tokens(BYTES, rows[:10])
    model, ids = tiny_model('affine'), ez.c4_tokens(BYTES, rows)
    r = ez.c4_perplexity(model, ids, 5, 16, batch_size=2)
    windows = torch.tensor(ids[:80]).view(5, 16)
    with torch.no_grad():
        nlls = [F.cross_entropy(model(w[None])[0][0, :-1], w[1:]).item() for w in windows]
    assert r['n'] == 5 and r['seqlen'] == 16 and r['ppl'] == pytest.approx(math.exp(sum(nlls) / 5),
                                                                           rel=1e-10)
    # fewer tokens: total // seqlen windows
    assert ez.c4_perplexity(model, ids[:50], 256, 16, 4)['n'] == 3


@pytest.mark.parametrize('task,row,message', [
    ('arc_easy', dict(TASK_ROWS['arc_easy'], answerKey='E'), "bad label answerKey='E'"),
    ('hellaswag', {k: v for k, v in TASK_ROWS['hellaswag'].items() if k != 'ctx_b'},
     "missing field 'ctx_b'"),
    ('hellaswag', dict(TASK_ROWS['hellaswag'], label=''), "bad label label=''"),
    ('piqa', dict(TASK_ROWS['piqa'], label=2), 'bad label label=2'),
    ('boolq', dict(TASK_ROWS['boolq'], label=True), 'bad label label=True'),
    ('winogrande', dict(TASK_ROWS['winogrande'], answer=1), "bad label answer=1"),
    ('winogrande', dict(TASK_ROWS['winogrande'], sentence='no blank'), "no '_' blank"),
    ('piqa', ['not', 'a', 'dict'], 'expected a JSON object'),
])
def test_bad_rows(task, row, message):
    with pytest.raises(RunError, match=rf"^{task}: row 1 of here: .*{message}"):
        ez.build_docs(task, [TASK_ROWS[task], row], 'here')


def write_checkpoint(path, model):
    torch.save(dict(model=model.state_dict(), model_config=asdict(model.config),
                    tokenizer=tokenizer_info(BYTES, 'bytes')), path)
    return path


def test_cli(tmp_path, bpe, capsys):
    ckpt = write_checkpoint(tmp_path / 'ckpt.pt', tiny_model('affine', dtype=torch.float32))
    data = write_task_data(tmp_path / 'data')
    common = [f'--ckpt={ckpt}', f'--data_dir={data}', '--log_samples=True', '--batch_size=3',
              '--c4_seqlen=32', '--c4_windows=4']
    results = eval_zeroshot.main(common + [f'--out={tmp_path / "r.json"}'])
    saved = json.loads((tmp_path / 'r.json').read_text())
    assert list(saved) == list(ez.DEFAULT_TASKS)
    for task in TASK_ROWS:
        r = saved[task]
        assert (r['n'] == 3 and 0 <= r['acc'] <= 1 and len(r['docs']) == 3
                and r['docs'][2]['doc_index'] == 2)
        assert (r['acc_norm'] is None) == (task in ('boolq', 'winogrande'))
        assert len(r['docs'][0]['logliks']) == len(ez.DOC_BUILDERS[task](TASK_ROWS[task]).requests)
    assert saved['c4']['n'] == 4 and 'c4-new' in saved['c4']['protocol']
    assert 'hellaswag' in capsys.readouterr().out
    slow = eval_zeroshot.main(common
                              + ['--tasks=hellaswag,boolq', '--one_by_one=True', '--limit=2'])
    for task in ('hellaswag', 'boolq'):
        for a, b in zip(slow[task]['docs'], results[task]['docs'][:2]):
            assert a['logliks'] == pytest.approx(b['logliks'], rel=1e-5)
    with pytest.raises(SystemExit):
        eval_zeroshot.main(common + ['--tasks=arc_easy,nope'])
    with pytest.raises(SystemExit):
        eval_zeroshot.main(common + ['--limit=two'])
    # not the checkpoint's
    write_tiktoken_file(tmp_path / 'tok.model', {bytes([b]): b for b in range(256)})
    with pytest.raises(RunError, match='not the one the model was trained with'):
        eval_zeroshot.main(common + [f'--tokenizer={tmp_path / "tok.model"}'])
    # the model evaluated, not a "teacher"
    (tmp_path / 'broken.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(RunError, match=rf"^model {tmp_path / 'broken.pt'}: .* is not a readable "
                                       r"checkpoint"):
        eval_zeroshot.main([a for a in common if not a.startswith('--ckpt')]
                           + [f'--ckpt={tmp_path / "broken.pt"}'])


def eval_process(*args):
    """eval_zeroshot.py run as a user runs it: (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, 'eval_zeroshot.py', *args], cwd=ROOT,
                          capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def test_every_tasks_file_is_checked_before_any_task_is_scored(tmp_path):
    """Issue 62: a --data_dir without c4 scored the six tasks (46 s with SmolLM2), then stopped on
    c4's missing file, and wrote neither its table nor --out. Now every task's file is looked for
    first: one line names each one missing, before the model is loaded; nothing is written. A file
    given as --data_dir is said to be one."""
    ckpt = write_checkpoint(tmp_path / 'ckpt.pt', tiny_model('affine', dtype=torch.float32))
    data = write_task_data(tmp_path / 'data')
    for task in ('c4', 'piqa'):
        os.remove(ez.task_file(task, data))
    out = tmp_path / 'results' / 'eval.json'
    code, stdout, err = eval_process(f'--ckpt={ckpt}', f'--data_dir={data}', f'--out={out}')
    assert code == 1 and stdout == '' and err.splitlines() == [
        f"eval_zeroshot.py: error: --data_dir={data}: no file for 2 of the 7 tasks: piqa "
        f"({data / 'piqa' / 'validation.jsonl'}), c4 ({data / 'c4' / 'validation.jsonl'}); export "
        f"them there with --export_data={data}, or leave them out of --tasks"]
    assert not (tmp_path / 'results').exists()
    code, _, err = eval_process(f'--ckpt={ckpt}', f'--data_dir={ckpt}', '--tasks=boolq')
    assert code == 1 and err.splitlines() == [
        f"eval_zeroshot.py: error: --data_dir={ckpt}: is a file, not a directory; give the "
        "directory that --export_data wrote"]


def test_a_task_given_twice_is_refused(tmp_path, capsys):
    """Issue 62: --tasks=heldout,heldout scored the task twice."""
    with pytest.raises(SystemExit) as stop:
        eval_zeroshot.main(['--ckpt=out', '--tasks=heldout,boolq,heldout'])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "error: --tasks=heldout,boolq,heldout: heldout given more than once; --tasks takes each "
        "value once")


def test_an_unfinished_run_is_evaluated_only_when_asked(data_dir, tmp_path, capsys):
    """Issue 62: a run stopped at step 29 of 300 (its train.py then exited 0, and a chain went on
    to evaluate it) was scored with no word that it had not finished. Now its evaluation is
    refused in one line that says so and how to go on; --allow_unfinished=True scores it, with a
    note."""
    model = tiny_model('softmax', dtype=torch.float32)
    ckpt = tmp_path / 'run' / 'ckpt.pt'
    ckpt.parent.mkdir()
    torch.save(dict(model=model.state_dict(), model_config=asdict(model.config),
                    tokenizer=tokenizer_info(BYTES, 'bytes'), step=29,
                    config=dict(max_iters=300, out_dir=str(ckpt.parent))), ckpt)
    args = [f'--ckpt={ckpt.parent}', '--tasks=heldout', f'--heldout_data={data_dir}',
            '--heldout_docs=4']
    code, stdout, err = eval_process(*args, f'--out={tmp_path / "eval.json"}')
    assert code == 1 and stdout == '' and err.splitlines() == [
        f"eval_zeroshot.py: error: {ckpt} holds step 29 of its run's max_iters=300: the run has "
        "not finished; continue it with the train.py command that started it (it continues from "
        "this checkpoint), or pass --allow_unfinished=True to use it as it is"]
    assert not (tmp_path / 'eval.json').exists()
    assert eval_zeroshot.main(args + ['--allow_unfinished=True'])['heldout']['n'] == 4
    assert (f"note: {ckpt} holds step 29 of its run's max_iters=300: the run has not finished; "
            "used as it is (--allow_unfinished=True)") in capsys.readouterr().err.splitlines()


def test_heldout(tmp_path):
    words = [f'w{i % 97}{"." if i % 11 == 0 else ""}' for i in range(6000)]
    text = ' '.join(words)
    checksum = write_shard(str(tmp_path / 'val_000000.bin'),
                           [np.frombuffer(text.encode(), np.uint8)], 'uint16')
    (tmp_path / 'meta.json').write_text(json.dumps(dict(tokenizer=tokenizer_info(BYTES, 'bytes'),
                                                        vocab_size=257,
                                                        splits=dict(
        val=dict(shards=['val_000000.bin'])),
                                                        checksums={'val_000000.bin': checksum})))
    rows = ez.heldout_rows(str(tmp_path), 50)
    assert rows == ez.heldout_rows(str(tmp_path), 50) and len(rows) == 50
    for row in rows:
        assert (len(row['endings']) == 4 and row['context'] + ' '
                + row['endings'][row['label']] in text)
    assert len({r['label'] for r in rows}) == 4
    with pytest.raises(RunError, match='too short'):
        ez.heldout_rows(str(tmp_path), 1000)


# -----------------------------------------------------------------------------------------------
# Hugging Face models with any byte-level BPE tokenizer (issue 14), against the harness written out
# here

# rows whose text the tokenizer families split differently: digit runs, unicode, CRLF, contractions,
# emoji, code
FAMILY_ROWS = {
    'arc_easy': dict(question='Which is larger: 1234567 or 999.5?', answerKey='A',
                     choices=dict(text=['1234567', '999.5', '12,345 (½ of '
                                                            '24,690)'], label=['A', 'B', 'C'])),
    'hellaswag': dict(activity_label='Cooking 🍳', ctx_a="They're making crêpes\r\nfor 4 "
                                                        "people.", ctx_b='then they',
                      endings=['flip them   twice.', 'add 250 g of flour 🥞', 'say "naïve" 3 '
                                                                             'times'], label='1'),
    'piqa': dict(goal='How do I print 42 in Python?', sol1='print(40 + 2)  # prints '
                                                           '42', sol2='echo $((6*7))',
                 label=0),
    'boolq': dict(question="is 2024 a leap year", passage='2024 is divisible by 4 (2024 / 4 = '
                                                          '506).\nYes, it is.',
                  label=1),
    'winogrande': dict(sentence="Tom's 3 cats didn't fit the 2 boxes because _ were too "
                                "many.", option1='the cats',
                       option2='the boxes', answer='1'),
}


def harness_logliks(model_dir, docs, max_length):
    """What lm-evaluation-harness 0.4.9 computes per request (--model hf, batch size 1, float32),
    written out with the `tokenizers` library (what transformers' fast tokenizer runs on
    tokenizer.json) and the transformers model: the context's trailing whitespace moves to the
    continuation; continuation = enc(context + continuation)[len( enc(context)):], no special
    tokens; the input is the last max_length + 1 tokens minus the last one; the score is the sum of
    the continuation's log-probabilities."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    tok = Tokenizer.from_file(str(model_dir / 'tokenizer.json'))
    model = AutoModelForCausalLM.from_pretrained(model_dir,
                                                 attn_implementation='eager').float().eval()
    scores = []
    for doc in docs:
        for context, continuation in doc.requests:
            n = len(context) - len(context.rstrip())
            if n:
                context, continuation = context[:-n], context[-n:] + continuation
            whole = tok.encode(context + continuation, add_special_tokens=False).ids
            ctx = tok.encode(context, add_special_tokens=False).ids
            cont = whole[len(ctx):]
            inp = (ctx + cont)[-(max_length + 1):][:-1]
            with torch.no_grad():
                logp = F.log_softmax(model(torch.tensor([inp])).logits[0].double(), -1)
            scores.append(sum(logp[len(inp) - len(cont) + i, t].item() for i, t in enumerate(cont)))
    return scores


@pytest.mark.parametrize('kind', ['smollm_llama', 'qwen2_gpt2_regex', 'qwen2_padded'])
def test_hf_models_of_every_tokenizer_family_score_as_the_harness(kind, family_teachers, tmp_path):
    """eval_zeroshot.py --hf_model with a SmolLM-shaped Llama (refused before issue 14), a qwen2
    model whose tokenizer.json uses GPT-2's regex (tokenized with Qwen's before), and a
    Qwen2.5-shaped model with a padded vocabulary: every choice's log-likelihood equals the
    harness's to 1e-3."""
    model_dir = family_teachers[kind]
    data = tmp_path / 'data'
    for task, row in FAMILY_ROWS.items():
        (data / task).mkdir(parents=True)
        (data / task / (ez.HUB[task][2] + '.jsonl')).write_text(json.dumps(row) + '\n'
                                                                + json.dumps(TASK_ROWS[task])
                                                                + '\n')
    results = eval_zeroshot.main([f'--hf_model={model_dir}', f'--data_dir={data}',
                                  f'--tasks={",".join(FAMILY_ROWS)}',
                       '--log_samples=True', '--batch_size=4', '--device=cpu', '--dtype=float32'])
    for task in FAMILY_ROWS:
        docs = ez.build_docs(task, [FAMILY_ROWS[task], TASK_ROWS[task]], 'here')
        ours = [s for d in results[task]['docs'] for s in d['logliks']]
        assert ours == pytest.approx(harness_logliks(model_dir, docs, 128), abs=1e-3), task
    # these tokenizers put no BOS before a text: --add_bos is refused, an empty context would be
    # scored after EOS
    with pytest.raises(RunError, match='--add_bos: the bpe tokenizer puts no BOS before a text'):
        eval_zeroshot.main([f'--hf_model={model_dir}', f'--data_dir={data}', '--tasks=piqa',
                            '--add_bos=True'])
    enc = load_tokenizer(str(model_dir))
    assert ez.encode_request(enc, '', ' '
                                      'x', 8,
                             prefix_id=enc.ids([enc.prefix_token])[0])[0] == tuple(enc.ids([EOT]))
    with pytest.raises(ValueError, match='names neither'):
        ez.encode_request(enc, '', ' x', 8, prefix_id=None)
    # c4 is tokenized as the HF tokenizer tokenizes a text (no BOS for these tokenizers)
    rows = [dict(text=f'doc {i}: 1234 naïve\r\n🤖') for i in range(ez.C4_DOCS)]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / 'tokenizer.json'))
    assert ez.c4_tokens(enc, rows) == tok.encode(' '.join(r['text'] for r in rows)).ids


# -----------------------------------------------------------------------------------------------
# Task files that hold no usable document, and a hub that cannot be reached: one line each (issue
# 43)


def unreachable_hub(monkeypatch):
    """This process's environment (and its children's) made that of a machine where the hub cannot
    be reached, whatever this machine's network: the hub named at a local port nothing listens on,
    no proxy, no offline mode."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    monkeypatch.setenv('HF_ENDPOINT', f'http://127.0.0.1:{port}')
    for name in ('hf_hub_offline', 'hf_datasets_offline', 'http_proxy', 'https_proxy', 'all_proxy'):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


C4_ROWS = [json.dumps(dict(text=f'doc {i}')) for i in range(ez.C4_DOCS)]


@pytest.mark.parametrize('task,lines,message', [
    ('piqa', b'', r'piqa: {path} holds no documents; export the task again \(--export_data=DIR\) '
                  r'or leave piqa out'),
    ('boolq', json.dumps(TASK_ROWS['boolq']).replace('The sky', 'Caf\u00e9').encode('latin-1'),
     r'boolq: row 0 of {path}: not UTF-8 \(byte 0xe9 at byte 47 of the line\); convert the file '
     r'\(iconv -f latin1'),
    ('piqa', json.dumps([TASK_ROWS['piqa']]).encode(), r'piqa: row 0 of {path}: expected a JSON '
                                                       r'object, got list$'),
    ('piqa', json.dumps(TASK_ROWS['piqa']).encode() + b'\n{"goal": "cut', r'piqa: row 1 of {path}: '
                                                                          r'not JSON: '),
    ('c4', b'', r'c4: the c4-new protocol needs the first 1100 validation documents, got 0 from '
                r'{path}$'),
    ('c4', '\n'.join(C4_ROWS[:5] + ['{"txt": "doc 5"}'] + C4_ROWS[6:]).encode(),
     r"c4: row 5 of {path}: missing field 'text'$"),
    ('c4', '\n'.join(C4_ROWS[:-1] + ['1100']).encode(), r'c4: row 1099 of {path}: expected a JSON '
                                                        r'object, got int$'),
], ids=['empty', 'latin-1', 'json-array', 'cut-json', 'c4-empty', 'c4-no-text', 'c4-not-an-object'])
def test_a_task_file_without_usable_documents_is_one_line(tmp_path, task, lines, message):
    """An empty task file (before: StatisticsError), a Latin-1 one (UnicodeDecodeError), C4 rows
    that are no documents (ValueError, TypeError); a JSON array and a cut JSON line were one line
    already, and stay so."""
    data = write_task_data(tmp_path / 'data')
    path = data / task / (ez.HUB[task][2] + '.jsonl')
    path.write_bytes(lines)
    ckpt = write_checkpoint(tmp_path / 'ckpt.pt', tiny_model(dtype=torch.float32))
    with pytest.raises(RunError, match='^' + message.format(path=re.escape(str(path)))) as e:
        eval_zeroshot.main([f'--ckpt={ckpt}', f'--data_dir={data}', f'--tasks={task}',
                            '--c4_seqlen=16'])
    assert '\n' not in str(e.value)


def test_an_unreachable_hub_is_one_line_in_seconds(tmp_path, monkeypatch):
    """Before, datasets retried for about 26 s before it failed; the hub is now tried for a
    connection first. In datasets' offline mode the cache is read (no connection is tried), and no
    copy there is the same one line."""
    unreachable_hub(monkeypatch)
    ckpt = write_checkpoint(tmp_path / 'ckpt.pt', tiny_model(dtype=torch.float32))
    start = time.monotonic()
    with pytest.raises(RunError, match=r'^piqa: cannot load baber/piqa \(None, validation\) from '
                                       r'the hub: '
                                       r'the Hugging Face hub \(127\.0\.0\.1:\d+\) cannot be '
                                       r'reached: .*; '
                                       r'offline, export it .* --data_dir=DIR') as e:
        eval_zeroshot.main([f'--ckpt={ckpt}', '--tasks=piqa'])
    assert (time.monotonic() - start < 15 and '\n' not in str(e.value)
            and isinstance(e.value, ez.HubUnreachable))
    monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    # offline mode: datasets reads its cache and connects nowhere
    assert ez.hub_unreachable() is None
    import datasets

    def no_copy(*args, **kwargs):  # what datasets' offline mode raises without a copy in the cache
        raise ConnectionError("Couldn't reach 'baber/piqa' on the Hub (OfflineModeIsEnabled)")
    monkeypatch.setattr(datasets, 'load_dataset', no_copy)
    with pytest.raises(ez.HubUnreachable, match=r"^piqa: cannot load .*\(OfflineModeIsEnabled\); "
                                                r"offline, export"):
        eval_zeroshot.main([f'--ckpt={ckpt}', '--tasks=piqa'])
