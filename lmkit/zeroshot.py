"""
Zero-shot evaluation's library, as in the paper's Tables 1-3: the six tasks' documents as
lm-evaluation-harness v0.4.9 builds them (its files cited beside each rule), their requests encoded
and scored in batches (score_requests) or one by one (score_one_by_one, the slow reference), the
metrics, the hub and offline task data, and C4 perplexity. docs/evaluation.md walks through the
rules.
"""
import json
import math
import os
import random
import re
import socket
import statistics
import threading
import urllib.parse
import urllib.request
from collections import namedtuple

import torch
import torch.nn.functional as F

from lmkit.errors import RunError
from lmkit.files import atomic_write
from lmkit.data import read_meta, read_split
from lmkit.tokenizer import load_tokenizer
from model import KVCache

# task -> (hub dataset path, config name, the split the harness evaluates) (lm-eval's task YAMLs:
# dataset_path, dataset_name, test_split or else validation_split). datasets >= 4 cannot run the
# dataset scripts behind v0.4.9's legacy names 'hellaswag', 'super_glue' and 'winogrande', so we
# read their script-free copies, the ones later harness versions switched to (not verified
# row-identical to the legacy ones).
HUB = {
    'arc_easy': ('allenai/ai2_arc', 'ARC-Easy', 'test'),
    'arc_challenge': ('allenai/ai2_arc', 'ARC-Challenge', 'test'),
    'hellaswag': ('Rowan/hellaswag', None, 'validation'),
    'piqa': ('baber/piqa', None, 'validation'),
    'boolq': ('aps/super_glue', 'boolq', 'validation'),
    'winogrande': ('allenai/winogrande', 'winogrande_xl', 'validation'),
    'c4': ('allenai/c4', None, 'validation'),
}
# the only file GPTQ's C4 protocol reads (gptq's datautils.py)
C4_SHARD = 'en/c4-validation.00000-of-00008.json.gz'
# GPTQ's c4-new (datautils.py, get_c4_new): the first 1100 documents, joined with single spaces
C4_DOCS = 1100
TASKS = tuple(HUB) + ('heldout',)
DEFAULT_TASKS = tuple(HUB)

# One document: its loglikelihood requests (context, continuation), the gold index, and the
# character length of each choice for acc_norm (None where the harness reports acc only: BoolQ and
# Winogrande, per their YAMLs).
Doc = namedtuple('Doc', 'requests gold lengths')

# -----------------------------------------------------------------------------
# Documents: one function per task, from a row in the hub's own schema


def field(row, name, kind=None):
    if name not in row:
        raise ValueError(f"missing field {name!r}")
    if kind is not None and not isinstance(row[name], kind):
        raise ValueError(f"field {name!r} is {type(row[name]).__name__}, expected {kind.__name__}")
    return row[name]


def label_index(value, n, name):
    """An integer label in range(n); the strings "0".."n-1" too (HellaSwag's label is a string,
    which lm_eval/tasks/hellaswag/utils.py turns into an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) \
            or not re.fullmatch(r'\d+', str(value)) or int(value) >= n:
        raise ValueError(f"bad label {name}={value!r}: expected an integer in [0, {n})")
    return int(value)


def choice_doc(context, choices, gold, norm=True):
    """One request (context, " " + choice) per choice (ConfigurableTask.construct_requests);
    acc_norm divides by len(choice) (ConfigurableTask.process_results)."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"choices must be a non-empty list of strings, got {choices!r}")
    return Doc([(context, ' ' + c) for c in choices], gold, [float(len(c)) for c in choices] if norm
               else None)


def arc_doc(row):
    """lm_eval/tasks/arc/arc_easy.yaml: "Question: {question}\\nAnswer:", choices.text, gold =
    position of answerKey in choices.label."""
    choices = field(row, 'choices', dict)
    texts, labels = field(choices, 'text', list), field(choices, 'label', list)
    key = field(row, 'answerKey')
    if len(texts) != len(labels) or key not in labels:
        raise ValueError(f"bad label answerKey={key!r}: not one of choices.label {labels!r} (for "
                         f"{len(texts)} texts)")
    return choice_doc('Question: ' + field(row, 'question', str) + '\nAnswer:', texts,
                      labels.index(key))


def hellaswag_preprocess(text):
    """lm_eval/tasks/hellaswag/utils.py, preprocess, in this order: strip once, " [title]" -> ". ",
    drop [...] (non-greedy), one pass of "  " -> " " (so three spaces become two; a trailing "
    [step]" leaves a trailing space)."""
    text = text.strip().replace(' [title]', '. ')
    text = re.sub(r'\[.*?\]', '', text)
    return text.replace('  ', ' ')


def hellaswag_doc(row):
    """lm_eval/tasks/hellaswag/utils.py, process_docs: ctx = ctx_a + " " + ctx_b.capitalize()
    (str.capitalize lower-cases the rest); query = preprocess(activity_label + ": " + ctx); choices
    = preprocess(each ending)."""
    endings = field(row, 'endings', list)
    ctx = field(row, 'ctx_a', str) + ' ' + field(row, 'ctx_b', str).capitalize()
    query = hellaswag_preprocess(field(row, 'activity_label', str) + ': ' + ctx)
    return choice_doc(query, [hellaswag_preprocess(e) for e in endings],
                      label_index(field(row, 'label'), len(endings), 'label'))


def piqa_doc(row):
    """lm_eval/tasks/piqa/piqa.yaml: "Question: {goal}\\nAnswer:", choices [sol1, sol2], gold =
    label."""
    return choice_doc('Question: ' + field(row, 'goal', str) + '\nAnswer:',
                      [field(row, 'sol1', str), field(row, 'sol2', str)],
                      label_index(field(row, 'label'), 2, 'label'))


def boolq_doc(row):
    """lm_eval/tasks/super_glue/boolq/default.yaml: "{passage}\\nQuestion: {question}?\\nAnswer:" (a
    "?" always appended), choices no/yes, acc only."""
    context = (field(row, 'passage', str) + '\nQuestion: ' + field(row, 'question', str)
               + '?\nAnswer:')
    return choice_doc(context, ['no', 'yes'], label_index(field(row, 'label'), 2, 'label'),
                      norm=False)


def winogrande_doc(row):
    """lm_eval/tasks/winogrande/default.yaml and preprocess_winogrande.py, partial scoring: the two
    contexts are sentence[:k] + option_i (k = the first "_"), the shared continuation is " " +
    sentence[k+1:].strip(); acc only."""
    sentence, answer = field(row, 'sentence', str), field(row, 'answer')
    k = sentence.find('_')
    if k < 0:
        raise ValueError(f"sentence has no '_' blank: {sentence!r}")
    if answer not in ('1', '2'):
        raise ValueError(f"bad label answer={answer!r}: expected '1' or '2'")
    suffix = ' ' + sentence[k + 1:].strip()
    options = [field(row, 'option1', str), field(row, 'option2', str)]
    return Doc([(sentence[:k] + option, suffix) for option in options], int(answer) - 1, None)


def heldout_doc(row):
    """Our quick-start task (not the harness's), scored exactly like HellaSwag: context, " " + each
    ending."""
    return choice_doc(field(row, 'context', str), field(row, 'endings', list),
                      label_index(field(row, 'label'), len(row['endings']), 'label'))


DOC_BUILDERS = dict(arc_easy=arc_doc, arc_challenge=arc_doc, hellaswag=hellaswag_doc, piqa=piqa_doc,
                    boolq=boolq_doc, winogrande=winogrande_doc, heldout=heldout_doc)


def parse_rows(task, rows, where, parse):
    """[parse(row) for each row]; a row that is not a JSON object, or that parse refuses
    (ValueError), is a RunError naming the task, the row and where it is."""
    parsed = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            parsed.append(parse(row))
        except ValueError as e:
            raise RunError(f"{task}: row {i} of {where}: {e}") from None
    return parsed


def build_docs(task, rows, where):
    if not rows:  # an accuracy over no document is no number (statistics.fmean refuses it)
        raise RunError(f"{task}: {where} holds no documents; export the task again "
                       f"(--export_data=DIR) or leave {task} out of --tasks")
    return parse_rows(task, rows, where, DOC_BUILDERS[task])

# -----------------------------------------------------------------------------------------------
# Data: the hub (same dataset, config and split as the harness), or <data_dir>/<task>/<split>.jsonl
# offline


# seconds the hub has to accept a connection; offline, datasets would retry for ~26 s instead
HUB_TIMEOUT = 2.0
OFFLINE_VARIABLES = ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')


class HubUnreachable(RunError):
    """The Hugging Face hub cannot be reached (no network, a firewall, offline mode); reason: how,
    in words."""

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


def hub_unreachable(timeout=HUB_TIMEOUT):
    """Why the hub (HF_ENDPOINT, else huggingface.co, through the proxy the environment names)
    accepts no TCP connection within `timeout` seconds, else None. None in datasets' offline mode
    too (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): there datasets never connects, and reads its cache at
    once."""
    if any(os.environ.get(name, '').strip().upper() in ('1', 'ON', 'YES', 'TRUE')
           for name in OFFLINE_VARIABLES):
        return None
    url = urllib.parse.urlsplit(os.environ.get('HF_ENDPOINT') or 'https://huggingface.co')
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and url.hostname and not urllib.request.proxy_bypass(url.hostname):
        url = urllib.parse.urlsplit(proxy if '://' in proxy else f'http://{proxy}')
    try:
        address = url.hostname, url.port or (443 if url.scheme == 'https' else 80)
    except ValueError:  # a malformed port: datasets says what is wrong with it
        return None
    if not address[0]:
        return None
    failure = []

    def connect():
        try:
            socket.create_connection(address, timeout=timeout).close()
            failure.append(None)
        except OSError as e:
            failure.append(e)

    # in a thread: the name lookup before the connection has no timeout of its own
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not failure:
        return (f"the Hugging Face hub ({address[0]}:{address[1]}) did not answer within "
                f"{timeout + 1:g} s")
    if failure[0] is not None:
        return f"the Hugging Face hub ({address[0]}:{address[1]}) cannot be reached: {failure[0]}"
    return None


def hub_rows(task, limit=None):
    path, name, split = HUB[task]
    what = f"{task}: cannot load {path} ({name}, {split}) from the hub"
    advice = ("offline, export it on a machine with internet (--export_data=DIR) and pass "
              "--data_dir=DIR")
    reason = hub_unreachable()  # before datasets, whose retries take half a minute to fail
    if reason:
        raise HubUnreachable(f"{what}: {reason}; {advice} (or, to read a copy in the datasets "
                             "cache, set HF_DATASETS_OFFLINE=1)", reason)
    from datasets import load_dataset  # only here: offline runs never touch the hub
    try:
        if task == 'c4':
            ds = load_dataset(path, data_files={split: C4_SHARD}, split=split)
        else:
            ds = load_dataset(path, name, split=split)
    except ConnectionError as e:  # offline mode (HF_DATASETS_OFFLINE) with no copy in the cache
        raise HubUnreachable(f"{what}: {e}; {advice}",
                             f"the Hugging Face hub cannot be reached: {e}") from None
    except (OSError, ValueError) as e:  # unknown dataset, missing split
        raise RunError(f"{what}: {e}; {advice}") from None
    return ds.select(range(min(limit, len(ds)))) if limit is not None else ds


def task_file(task, data_dir):
    """Where --data_dir holds a task's split: <data_dir>/<task>/<split>.jsonl."""
    return os.path.join(data_dir, task, HUB[task][2] + '.jsonl')


def check_task_files(tasks, data_dir):
    """RunError naming every task of `tasks` whose file data_dir lacks (all of them, at once: a
    missing one found after the others were scored lost their scores)."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise RunError(f"--data_dir={data_dir}: is a file, not a directory; give the directory "
                       "that --export_data wrote")
    missing = [f"{task} ({task_file(task, data_dir)})" for task in tasks
               if not os.path.isfile(task_file(task, data_dir))]
    if missing:
        raise RunError(f"--data_dir={data_dir}: no file for {len(missing)} of the {len(tasks)} "
                       f"tasks: {', '.join(missing)}; export them there with "
                       f"--export_data={data_dir}, or leave them out of --tasks")


def read_rows(task, data_dir, limit=None):
    """(rows, where): the first `limit` rows (all if None) of the task's split, in the split's
    order."""
    if data_dir is None:
        return list(hub_rows(task, limit)), f"{HUB[task][0]} {HUB[task][2]}"
    path = task_file(task, data_dir)
    if not os.path.isfile(path):
        raise RunError(f"{task}: {path}: no such file (export it with --export_data={data_dir})")
    rows = []
    with open(path, 'rb') as f:
        for i, line in enumerate(f):
            if limit is not None and len(rows) == limit:
                break
            try:
                rows.append(json.loads(line.decode('utf-8')))
            except UnicodeDecodeError as e:
                raise RunError(f"{task}: row {i} of {path}: not UTF-8 (byte 0x{line[e.start]:02x} "
                               f"at byte {e.start} of the line); convert the file (iconv -f latin1 "
                               "-t utf-8 for Latin-1), or export it again with "
                               "--export_data") from None
            except json.JSONDecodeError as e:
                raise RunError(f"{task}: row {i} of {path}: not JSON: {e}") from None
    return rows, path


def export_data(out_dir, tasks):
    """Write each task's evaluated split from the hub as <out_dir>/<task>/<split>.jsonl (c4: its
    first 1100 docs)."""
    for task in tasks:
        rows = hub_rows(task, C4_DOCS if task == 'c4' else None)
        path = task_file(task, out_dir)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + '\n')
        print(f"{task}: {len(rows)} rows -> {path}")


def heldout_rows(data_dir, n_docs, ctx_chars=160, cont_chars=48, n_choices=4, seed=0):
    """The quick-start task: n_docs passages of a prepare_data.py val split (decoded with the data's
    tokenizer), each cut at a space into a context and its true continuation; the other choices are
    the true continuations of other passages. Deterministic; meaningful for tiny models trained on
    the same corpus (held-out documents)."""
    meta = read_meta(data_dir)
    enc = load_tokenizer(meta['tokenizer']['spec'])
    special = set(meta['tokenizer']['special_tokens'].values())
    ids = [int(t) for shard in read_split(data_dir, 'val', meta) for t in shard]
    text = enc.decode([t for t in ids if t not in special])
    stride = len(text) // n_docs
    if stride < ctx_chars + cont_chars:
        raise RunError(f"heldout: {data_dir}'s val split ({len(text):,} characters) is too short "
                       f"for {n_docs} passages of {ctx_chars + cont_chars} characters; lower "
                       "--heldout_docs")
    passages = []
    for i in range(n_docs):
        # cut where a space is, so that context + " " + continuation is the original text
        cut = text.find(' ', i * stride + ctx_chars, (i + 1) * stride - cont_chars)
        cut = cut if cut >= 0 else i * stride + ctx_chars
        end = text.rfind(' ', cut + 1, cut + 1 + cont_chars)
        passages.append((text[cut - ctx_chars:cut],
                         text[cut + 1:end if end > cut + 1 else cut + 1 + cont_chars]))
    rng = random.Random(seed)
    rows = []
    for i, (context, true) in enumerate(passages):
        others = rng.sample([j for j in range(n_docs) if j != i], n_choices - 1)
        endings = [passages[j][1] for j in others]
        label = rng.randrange(n_choices)
        endings.insert(label, true)
        rows.append(dict(context=context, endings=endings, label=label))
    return rows

# -----------------------------------------------------------------------------------------------
# Requests: token ids, exactly as the harness builds them (lm_eval/api/model.py,
# lm_eval/models/huggingface.py)


def encode_request(enc, context, continuation, max_length, bos_id=None, prefix_id=None):
    """(model input ids, continuation ids) of one loglikelihood request. TemplateLM._encode_pair: an
    empty context is [prefix_id]; otherwise the context's trailing whitespace moves to the
    continuation and the pair is encoded jointly, the continuation being whole[len(ctx_ids):]. BOS
    (HFLM.tok_encode) is off by default: v0.4.9 encodes with add_special_tokens=False.
    HFLM._loglikelihood_tokens: keep the last max_length + 1 tokens, drop the final one. Raises
    ValueError when the continuation alone does not fit."""
    if context == '':
        if prefix_id is None:
            raise ValueError("an empty context is scored after the tokenizer's BOS, else its EOS, "
                             "and this tokenizer names neither")
        ctx_ids, cont_ids = [prefix_id], enc.encode_ordinary(continuation)
    else:
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        whole, ctx_ids = enc.encode_ordinary(context + continuation), enc.encode_ordinary(context)
        cont_ids = whole[len(ctx_ids):]
        if bos_id is not None:
            ctx_ids = [bos_id] + ctx_ids
    if not cont_ids:
        raise ValueError(f"the continuation {continuation!r} encodes to no tokens")
    if len(cont_ids) > max_length:
        raise ValueError(f"the continuation is {len(cont_ids)} tokens, longer than "
                         f"max_length={max_length} (even after left truncation of the context)")
    return tuple((ctx_ids + cont_ids)[-(max_length + 1):][:-1]), tuple(cont_ids)


def encode_docs(task, docs, enc, max_length, bos_id=None, prefix_id=None):
    """All requests of a task's documents, flat, in document then choice order."""
    requests = []
    for i, doc in enumerate(docs):
        for context, continuation in doc.requests:
            try:
                requests.append(encode_request(enc, context, continuation, max_length, bos_id,
                                               prefix_id))
            except ValueError as e:
                raise RunError(f"{task}: row {i}: {e}") from None
    return requests

# -----------------------------------------------------------------------------
# Scoring


def plan_forwards(requests, share_prefixes):
    """owner[i] = the request whose forward pass request i reads. share_prefixes: whether a request
    whose input is a prefix of another's may be read from the longer one's forward pass (not
    ModelConfig.outputs_depend_on_length: every variant but affine with affine_bias_norm='seq_len';
    there only identical inputs share). Sorted lexicographically, a sequence is a prefix of some
    other exactly when it is a prefix of the next one, so one backward sweep finds the longest
    sequence each request can read from (identical inputs always share: the harness's logits cache,
    lm_eval/models/utils.py Collator)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i][0])
    owner = list(range(len(requests)))
    for a, b in zip(reversed(order[:-1]), reversed(order[1:])):
        x, y = requests[a][0], requests[b][0]
        if x == y or (share_prefixes and y[:len(x)] == x):
            owner[a] = owner[b]
    return owner


class ContinuationScores:
    """Each request's score from the hidden states of the forward that computed its input: the
    continuation's rows (the harness's rows inplen - C .. inplen - 1) only, through lm_head and
    log_softmax over the whole vocabulary in the logits' dtype, gathered across forwards into chunks
    of about `rows` rows. progress(done): the groups (documents) whose every request is scored."""

    def __init__(self, model, requests, readers, groups, progress, rows=1024):
        (self.model, self.requests, self.readers, self.rows,
         self.progress) = model, requests, readers, rows, progress
        self.scores = [None] * len(requests)
        self.groups, self.left, self.done = groups, {}, 0
        for g in groups:
            self.left[g] = self.left.get(g, 0) + 1
        self.pending, self.n_pending = [], 0  # (request, its rows' hidden states)

    def first_row(self, owner):
        """The first position of owner's input that one of its readers scores."""
        return min(len(self.requests[i][0]) - len(self.requests[i][1]) for i in self.readers[owner])

    def add(self, owner, hidden, start=0):
        """hidden: the hidden states of owner's input from position `start` on (at least to its
        end)."""
        for i in self.readers[owner]:
            inp, cont = self.requests[i]
            self.pending.append((i, hidden[len(inp) - len(cont) - start:len(inp) - start]))
            self.n_pending += len(cont)
        if self.n_pending >= self.rows:
            self.flush()

    def flush(self):
        if not self.pending:
            return
        hidden = torch.cat([h for _, h in self.pending])
        targets = torch.tensor([t for i, _ in self.pending for t in self.requests[i][1]],
                               device=hidden.device)
        logp = F.log_softmax(self.model.lm_head(hidden), dim=-1)
        picked = logp.gather(1, targets[:, None])[:, 0]
        for (i, _), s in zip(self.pending, picked.split([len(h) for _, h in self.pending])):
            self.scores[i] = s.sum().item()
            self.left[self.groups[i]] -= 1
            self.done += self.left[self.groups[i]] == 0
        self.pending, self.n_pending = [], 0
        if self.progress:
            self.progress(self.done)


def forward_padded(model, inputs, kv_caches=None):
    """The final hidden states (B, max length, C) of token sequences, right-padded with id 0 (as the
    harness pads), their real lengths given as seq_lens; after kv_caches' rows, if given."""
    device = next(model.parameters()).device
    lens = [len(x) for x in inputs]
    x = torch.zeros(len(inputs), max(lens), dtype=torch.long)
    for b, ids in enumerate(inputs):
        x[b, :lens[b]] = torch.tensor(ids)
    hidden, _ = model(x.to(device), seq_lens=torch.tensor(lens, device=device), kv_caches=kv_caches,
                      return_hidden=True)
    return hidden


def shared_prefix(inputs):
    """The longest prefix every sequence of inputs starts with (that of the lexicographically first
    and last)."""
    lo, hi = min(inputs), max(inputs)
    return lo[:next((n for n, (a, b) in enumerate(zip(lo, hi)) if a != b), min(len(lo), len(hi)))]


def prefix_units(requests, owners, groups):
    """[(prefix, owners)], longest prefix first: each group's distinct inputs (owners) with the
    prefix they all share; an input alone in its group, or in a group whose inputs share no first
    token, is a unit of its own whose prefix is the whole input."""
    members = {}
    for o in owners:
        members.setdefault(groups[o], []).append(o)
    units = []
    for inputs in members.values():
        prefix = shared_prefix([requests[o][0] for o in inputs]) if len(inputs) > 1 else ()
        units.extend([(prefix, inputs)] if prefix else [(requests[o][0], [o]) for o in inputs])
    return sorted(units, key=lambda unit: -len(unit[0]))


def full_passes(model, requests, scored, batch_size):
    """One forward per distinct input, longest first, right-padded batches."""
    forwards = sorted(scored.readers, key=lambda o: -len(requests[o][0]))
    for start in range(0, len(forwards), batch_size):
        batch = forwards[start:start + batch_size]
        hidden = forward_padded(model, [requests[o][0] for o in batch])
        for b, o in enumerate(batch):
            scored.add(o, hidden[b])
        scored.flush()


def shared_prefix_passes(model, requests, scored, groups, batch_size):
    """Each unit's prefix (prefix_units) once, in batches of batch_size prefixes, longest first;
    then the rest of each of its inputs after it, against the prefix's KV cache fanned out to them
    (KVCache.select), in batches of batch_size sorted by length. A request's rows before the end of
    the prefix come from the prefix's pass."""
    units = prefix_units(requests, list(scored.readers), groups)
    for start in range(0, len(units), batch_size):
        batch = units[start:start + batch_size]
        # r: (the unit's row b, an owner o)
        rest = lambda r: len(requests[r[1]][0]) - len(batch[r[0]][0])
        rests = sorted(((b, o) for b, (_, owners) in enumerate(batch) for o in owners), key=rest,
                       reverse=True)
        rests = [r for r in rests if rest(r) > 0]
        caches = [KVCache(len(batch[0][0]) + max(map(rest, rests), default=0))
                  for _ in range(model.config.n_layer)]
        hidden_prefix = forward_padded(model, [prefix for prefix, _ in batch], caches)
        for b, (prefix, owners) in enumerate(batch):
            for o in owners:
                if len(requests[o][0]) == len(prefix):
                    scored.add(o, hidden_prefix[b])
        for chunk in range(0, len(rests), batch_size):
            rows = rests[chunk:chunk + batch_size]
            fanned = [cache.select(torch.tensor([b for b, _ in rows], device=hidden_prefix.device))
                      for cache in caches]
            hidden_rest = forward_padded(model,
                                         [requests[o][0][len(batch[b][0]):] for b, o in rows],
                                         fanned)
            for r, (b, o) in enumerate(rows):
                n, first = len(batch[b][0]), min(scored.first_row(o), len(batch[b][0]))
                scored.add(o, torch.cat([hidden_prefix[b, first:n], hidden_rest[r]]), first)
        scored.flush()


@torch.inference_mode()
def score_requests(model, requests, batch_size, progress=None, groups=None):
    """Sum of continuation log-probabilities of each (input ids, continuation ids) request
    (HFLM._loglikelihood_tokens), each input computed once: identical inputs, and inputs that are
    prefixes of others, read one forward (plan_forwards). groups: each request's group (its
    document): a group's inputs share a prefix (the context), computed once, the rest of each input
    after it against its KV cache (shared_prefix_passes). Without groups, or where outputs depend on
    the call's length (ModelConfig.outputs_depend_on_length: a cache is not exact there), every
    distinct input is one whole forward (full_passes). progress(done): groups (else requests)
    scored."""
    exact_cache = not model.config.outputs_depend_on_length
    readers = {}
    for i, o in enumerate(plan_forwards(requests, exact_cache)):
        readers.setdefault(o, []).append(i)
    scored = ContinuationScores(model, requests, readers, groups or range(len(requests)), progress)
    if groups is not None and exact_cache:
        shared_prefix_passes(model, requests, scored, groups, batch_size)
    else:
        full_passes(model, requests, scored, batch_size)
    return scored.scores


@torch.inference_mode()
def score_one_by_one(model, requests, progress=None):
    """The straightforward reference (the harness at batch_size=1): one full forward pass per
    request."""
    device = next(model.parameters()).device
    scores = []
    for inp, cont in requests:
        logits, _ = model(torch.tensor([inp], device=device))
        logp = F.log_softmax(logits[0, -len(cont):], dim=-1)
        scores.append(logp.gather(1, torch.tensor(cont, device=device)[:, None]).sum().item())
        if progress:
            progress(len(scores))
    return scores


def argmax_first(values):
    """np.argmax semantics (ConfigurableTask.process_results): the first index of the maximum."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def mean_stderr(values):
    """lm_eval/api/metrics.py (mean, sample_stddev): the mean, and the sample standard deviation (n
    - 1) / sqrt(n) (None for a single document)."""
    stderr = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return statistics.fmean(values), stderr


def task_metrics(docs, logliks, log_samples=False):
    """acc, acc_norm (ConfigurableTask.process_results) and their stderr over documents; logliks
    holds the docs' requests' scores, flat."""
    acc, acc_norm, samples, k = [], [], [], 0
    for i, doc in enumerate(docs):
        ll = logliks[k:k + len(doc.requests)]
        k += len(doc.requests)
        pred = argmax_first(ll)
        acc.append(float(pred == doc.gold))
        if doc.lengths is not None:
            acc_norm.append(float(argmax_first([v / n for v, n in zip(ll, doc.lengths)])
                                  == doc.gold))
        if log_samples:
            samples.append(dict(doc_index=i, logliks=ll, pred=pred, gold=doc.gold))
    result = dict(zip(('acc', 'acc_stderr'), mean_stderr(acc)))
    result.update(zip(('acc_norm', 'acc_norm_stderr'), mean_stderr(acc_norm) if acc_norm
                      else (None, None)))
    return dict(result, n=len(docs), docs=samples)

# -----------------------------------------------------------------------------
# C4 perplexity (GPTQ's "c4-new": IST-DASLab/gptq, datautils.py get_c4_new and llama.py llama_eval)


def c4_tokens(enc, rows, where='the rows given'):
    """The first 1100 documents joined with single spaces, tokenized once with the special tokens
    the tokenizer puts around a text (Llama-3's BOS at the very start; nothing for GPT-2 or Qwen),
    as the HF tokenizer GPTQ calls does (GPTQ's datautils.py). where: what the rows are, for
    messages."""
    if len(rows) < C4_DOCS:
        raise RunError(f"c4: the c4-new protocol needs the first {C4_DOCS} validation documents, "
                       f"got {len(rows)} from {where}")
    text = ' '.join(parse_rows('c4', rows[:C4_DOCS], where, lambda row: field(row, 'text', str)))
    return enc.ids(enc.prefix) + enc.encode_ordinary(text) + enc.ids(enc.suffix)


@torch.inference_mode()
def c4_perplexity(model, ids, n_windows, seqlen, batch_size, progress=None, first_token=None):
    """GPTQ's evaluation loop (llama.py, llama_eval): min(n_windows, len(ids) // seqlen) disjoint
    windows from the start, each an independent sequence; the mean cross-entropy of each window's
    seqlen - 1 predictions; exp of their mean. first_token (a model trained with train.py's
    first_token='prefix'): each window is that token and the next seqlen - 1 tokens, as the model
    was trained."""
    body = seqlen - (first_token is not None)
    n = min(n_windows, len(ids) // body)
    if n == 0:
        raise RunError(f"c4: {len(ids)} tokens are fewer than one window of {seqlen}")
    device = next(model.parameters()).device
    windows = torch.tensor(ids[:n * body], dtype=torch.long).view(n, body)
    if first_token is not None:
        windows = torch.cat([torch.full((n, 1), first_token, dtype=torch.long), windows], dim=1)
    nlls = []
    for start in range(0, n, batch_size):
        x = windows[start:start + batch_size].to(device)
        hidden, _ = model(x, return_hidden=True)
        # lm_head one window at a time: 2048 x 128k float32 logits are 1 GB
        for h, w in zip(hidden, x):
            # cross-entropy in at least float32 (a float64 model stays float64)
            logits = model.lm_head(h[:-1])
            nlls.append(F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                                        w[1:]).item())
        if progress:
            progress(len(nlls))
    nll = statistics.fmean(nlls)
    return dict(ppl=math.exp(nll), nll=nll, n=n, seqlen=seqlen)
