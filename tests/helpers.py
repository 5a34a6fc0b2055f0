"""What several test files build the same way, as plain functions and constants (the fixtures built
from them are in conftest.py; tiny Hugging Face models, which need transformers, are in
hf_helpers.py): tiny byte-level BPE tokenizers trained here with the `tokenizers` library and the
files they are read from, the checkpoint an old commit wrote (tests/fixtures) and every command that
opens a checkpoint, train.py's arguments for a tiny run, a fake run directory for analyze.py."""
import base64
import json
import os
import random
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

import eval_zeroshot
from lmkit import zeroshot
from lmkit.tokenizer import gpt2_unicode_to_byte
from lmkit.files import read_log
from lmkit.errors import run_script
import prepare_data
from prepare_data import builtin_corpus

ROOT = Path(__file__).resolve().parents[1]

# -----------------------------------------------------------------------------
# Tokenizers

# Text with unicode (accents, CJK, emoji), whitespace runs, tabs, CRLF, digit runs and contractions.
TEXT = ("Hello,   world! It's 2024; we've 1234567 items\u2014costing $3.50 (½ off).\n\n"
        "  Ünïcödé: naïve café, 你好世界, 🤖🚀 emoji\ttab\r\nCRLF line.   \n"
        "THEY'RE LOUD'LL 'S 0.001 x=42*y  \n\n\n   trailing   ")
CODE = ('def f(x, y=3.14e-10):\n\tif x >= 0x1F:  # 🐍 comment\r\n        return {"a": [1, 22, 333, '
        '4444, 55555]}\n    s = f"{x!r:>10}" + \'don\\\'t\'  \t\n\n    return s.upper()  # WE\'RE  '
        ' DONE\n')
# Fresh text built from pieces the tokenizers treat differently: letters, contractions, ASCII and
# other digits (Arabic-Indic, superscripts, fractions, Roman numerals, Devanagari, Unicode 16's
# Kirat Rai), whitespace runs (tabs, CRLF, NBSP, ideographic space, line separator), punctuation,
# emoji with ZWJ and flags, CJK, combining marks.
POOL = (list("abcXYZé") + ["the", "don't", "'s", "'LL", "'ve", "x=1", "O'Neil"] + list("0123456789")
        + ["٣", "²", "½", "Ⅻ", "〇", "१", "12345", "3.14159", "\U00011DE3", "\U00016FF5"]
        + [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028"]
        + list(".,;:!?-_()[]{}<>\"'/\\@#$%^&*+=~`|")
        + ["🤖", "👩\u200d💻", "🇺🇸", "你好", "e\u0301", "한국어", "مرحبا", "नमस्ते", "    return x",
           "def f(a, b):"])
# The pre-tokenizer regexes as the HF tokenizers of Llama-3 (tokenizer.json, "Split" pre-tokenizer)
# and Qwen1.5/2 (PRETOKENIZE_REGEX of transformers' tokenization_qwen2.py) use them; written out
# independently of tokenizer.py.
HF_LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
HF_QWEN2_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
EOT = "<|endoftext|>"
CHAT = [EOT, '<|im_start|>', '<|im_end|>']


def corpus():
    return builtin_corpus()


def train_hf_bpe(regex, nfc, special_tokens):
    """A tiny byte-level BPE, set up like Llama-3's / Qwen's tokenizer.json; specials get ids after
    the merges."""
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus()[:40] + [TEXT], trainer)
    tok.add_special_tokens(special_tokens)
    return tok


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def write_tiktoken_file(path, ranks):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))


def byte_level(use_regex=True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def split_then_bytes(regex):  # Llama-3 and Qwen2's tokenizer.json
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    byte_level(False)])


def digits_then_gpt2(individual):  # SmolLM's (and StarCoder's) tokenizer.json
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=individual),
                                    byte_level()])


def hf_tokenizer(pre_tokenizer, nfc=False, leading_specials=(), specials=(), inline=(),
                 template=None):
    """A tiny byte-level BPE trained here. leading_specials get the first ids (as SmolLM's),
    specials ids after the merges (as Llama-3's, Qwen's); inline: (content, normalized) added tokens
    that are not special; template: the post-processor's single-text template, e.g. '<s> $A
    </s>'."""
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(leading_specials), show_progress=False)
    tok.train_from_iterator(corpus()[:40] + [TEXT, CODE], trainer)
    tok.add_special_tokens(list(specials))
    tok.add_tokens([AddedToken(t, special=False, normalized=normalized) for t,
                    normalized in inline])
    if template:
        names = [w for w in template.split() if w != "$A"]
        tok.post_processor = processors.TemplateProcessing(single=template,
                                                           special_tokens=[(n, tok.token_to_id(n))
                                                                           for n in names])
    return tok


def save_layout(directory, tok, tokenizer_config=None, config=None, special_tokens_map=None):
    """A directory as the hub has them: tokenizer.json and the given JSON files (None: no such
    file)."""
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    for name, obj in [("tokenizer_config.json", tokenizer_config), ("config.json", config),
                      ("special_tokens_map.json", special_tokens_map)]:
        if obj is not None:
            write_json(directory / name, obj)
    return directory


# Vocabularies without a token for every byte (SmolLM2's lacks 21, huggingface/smollm#81) SmolLM2's
# missing bytes: six ASCII controls, 0xC0 and 0xC1 (never in UTF-8), the lead bytes 0xF1, 0xF2,
# 0xF5-0xFF
SMOLLM2_LACKS = bytes([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                       *range(0xF5, 0x100)])
# text around them: the controls, characters led by F1 / F2 (whose other bytes are in the
# vocabulary), a missing byte inside pieces that merge once it is gone, long pieces, SignWriting and
# plane-14 tags (led by F0 / F3: kept), and SmolLM2's chat markup
LOSSY_POOL = ["\x04", "\x06", "\x13", "\x14", "\x16", "\x1d", "\U00040000", "\U0008ABCD",
              "\U000BFFFD", "!\x04!", "??\x06??", "a\x13b", " "
                                    "\x1d", "\x04\x06", "=" * 12 + "\x14" + "=" * 12,
              "\U0001D800\U0001DA8B",
              "\U000E0067\U000E007F", "\U0010FFFD", "<|im_start|>user\n", "<|im_end|>\n",
              "<|endoftext|>"]


def lossy_fuzz(seed):
    rng = random.Random(seed)
    return "".join(rng.choice(POOL + LOSSY_POOL * 2) for _ in range(rng.randrange(1, 80)))


def lossy_texts():
    return [TEXT, CODE, *corpus()[40:50], *(lossy_fuzz(seed) for seed in range(80))]


def lossy_tokenizer(pre_tokenizer, lacking=SMOLLM2_LACKS):
    """A tiny byte-level BPE with no token for the bytes in `lacking`: trained without their
    symbols, on text without the characters that hold them. Its <|endoftext|> is special."""
    to_unicode = {b: c for c, b in gpt2_unicode_to_byte().items()}
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet()
                if c not in {to_unicode[b] for b in lacking}]
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=alphabet, special_tokens=[EOT],
                                  show_progress=False)
    tok.train_from_iterator(["".join(c for c in t if not set(c.encode()) & set(lacking))
                             for t in corpus()[:40] + [TEXT, CODE]], trainer)
    tok.encode_special_tokens = True  # <|endoftext|> in a text is text, as in encode_ordinary
    return tok


def flip_byte(path, offset):
    """Damage a file as a failing disk or a bad copy would: one bit of the byte at offset flipped.
    The file is replaced (a new inode), so a process that checked the old one sees a changed file
    even within one clock tick."""
    damaged = bytearray(Path(path).read_bytes())
    damaged[offset] ^= 1
    Path(f"{path}.flipped").write_bytes(bytes(damaged))
    os.replace(f"{path}.flipped", path)
    return bytes(damaged)


# -----------------------------------------------------------------------------
# Evaluation tasks

# a row of each task in the hub's own schema (lm-evaluation-harness v0.4.9's task YAMLs read these
# fields)
TASK_ROWS = {
    'arc_easy': dict(id='x', question='Which is a gas?',
                     choices=dict(text=['ice', 'steam', 'rock'], label=['1', '2', '3']),
                     answerKey='2'),
    'arc_challenge': dict(question='Pick '
                                   'D.',
                          choices=dict(text=['a', 'b', 'c', 'd'], label=list('ABCD')),
                          answerKey='D'),
    'hellaswag': dict(ind=4, activity_label='Roof shingle removal',
                      ctx_a='A man is sitting on a roof.',
                      ctx_b='he starts pulling up Roofing. [title] '
                            'Then', ctx='(unused)', split='val',
                      endings=['  uses a ladder [step] ', 'a [header] b   c', 'x [title] y',
                               'plain.'],
                      label='2'),
    'piqa': dict(goal='How do I boil water?', sol1='Heat it.', sol2='Freeze it.', label=0),
    'boolq': dict(question='is the sky blue', passage='The sky is blue.', idx=0, label=1),
    'winogrande': dict(sentence="The cup didn't fit in the box because _ was too big. Really "
                                "_.", option1='the cup',
                       option2='the box', answer='1'),
}


def write_task_data(root):
    """eval_zeroshot.py's offline data (--data_dir) for every task: three rows of TASK_ROWS each,
    and 1100 short C4 documents."""
    for task, row in TASK_ROWS.items():
        path = root / task / (zeroshot.HUB[task][2] + '.jsonl')
        path.parent.mkdir(parents=True)
        rows = [row, dict(row, label=0) if 'label' in row and task != 'hellaswag' else row, row]
        path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    (root / 'c4').mkdir()
    (root / 'c4' / 'validation.jsonl').write_text(''.join(json.dumps(dict(text=f'doc {i}')) + '\n'
                                                          for i in range(1100)))
    return root


# -----------------------------------------------------------------------------
# The README's commands

def bash_words(block):
    """The commands of a bash block as bash reads them (loops unrolled, $v expanded, \\
    continuations joined), each an argv list. Every command is recorded, none run: the block runs in
    a bash that finds no program (PATH names no directory), whose command_not_found_handle prints
    the command's words. A glob that matches nothing is left as written (bash's default), to be
    expanded when the command runs."""
    record = 'command_not_found_handle() { printf "%s\\x1f" "$@"; printf "\\n"; }\n'
    done = subprocess.run([shutil.which('bash'), '-c', record + block],
                          env={'PATH': '/nonexistent'}, cwd='/',
                          capture_output=True, text=True, check=True)
    return [line.split('\x1f')[:-1] for line in done.stdout.splitlines()]


def readme_text():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        return f.read()


def readme_commands(heading):
    """The first bash block under README.md's `heading`, and its commands (bash_words)."""
    block = re.search(rf'^## {re.escape(heading)}\n.*?^```bash\n(.*?)^```', readme_text(),
                      re.M | re.S).group(1)
    return block, bash_words(block)


def every_readme_command():
    """Every command README.md shows: each bash block's (bash_words) and each inline `python
    ...`."""
    text = readme_text()
    blocks = [bash_words(block)
              for block in re.findall(r'^ *```bash\n(.*?)^ *```', text, re.M | re.S)]
    return [argv for words in blocks for argv in words] + [shlex.split(code) for code in
                                                            re.findall(r'`(python [^`]+)`', text)]


# -----------------------------------------------------------------------------
# A checkpoint of the old code, and every command that opens a checkpoint

# how it was made: its README.md the fixture's run (its README's command), less --out_dir
FIXTURE = os.path.join(ROOT, 'tests', 'fixtures', 'resume_2e82b72')
FIXTURE_RUN = ['--n_layer=1', '--n_head=2', '--n_kv_head=1', '--n_embd=8', '--intermediate_size=16',
               '--vocab_size=257',
               '--tie_embeddings=True', '--block_size=16', '--global_batch_size=4',
               '--micro_batch_size=2',
               '--warmup_iters=2', '--attention=affine', '--max_iters=4', '--eval_interval=2',
               '--eval_batches=2', '--log_interval=1000', '--peak_flops=1e12', '--device=cpu']


def fixture_data(out):
    """The fixture's data, prepared again into out by its README's command (the checkpoint records
    its fingerprint)."""
    prepare_data.main([f'--source={FIXTURE}/corpus.txt', '--txt_sample_by=paragraph',
                       '--tokenizer=bytes', f'--out_dir={out}', '--val_every=5', '--num_proc=1'])
    return out


def checkpoint_commands(run, data, tmp_path):
    """Every command that opens a checkpoint, pointed at `run` (a run directory of the fixture's
    shape, data: its data): (name, main, argv)."""
    import analyze  # (here: the scripts import much that only these commands need)
    import distill
    import export_hf
    import sample
    import train
    return [('eval_zeroshot.py --ckpt', eval_zeroshot.main, [f'--ckpt={run}', '--tasks=heldout',
                                                             f'--heldout_data={data}']),
            ('analyze.py '
             'attention', analyze.main,
             ['attention', str(run), f'--out_dir={tmp_path / "attention"}',
                                                    f'--data={data}', '--num_seqs=1',
              '--seq_len=16']),
            ('sample.py --ckpt', sample.main,
             [f'--ckpt={run}', '--num_samples=1', '--max_new_tokens=1']),
            ('export_hf.py --ckpt', export_hf.main,
             [f'--ckpt={run}', f'--out_dir={tmp_path / "hf"}']),
            ('train.py '
             '--teacher', train.main, [*FIXTURE_RUN, f'--data_dir={data}', f'--teacher={run}',
                                                f'--out_dir={tmp_path / "student"}']),
            ('a resume', train.main, [*FIXTURE_RUN, f'--data_dir={data}', f'--out_dir={run}']),
            ('distill.py --teacher', distill.main, [f'--teacher={run}', f'--data_dir={data}']),
            ('train.py --dry_run --teacher', train.main,
             [*FIXTURE_RUN, '--dry_run=True', f'--teacher={run}'])]


def refusal(capsys, main, argv):
    """What main(argv) printed through files.run_script: its exit status 1 and one line on
    stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_script(main, argv)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and 'Traceback' not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -----------------------------------------------------------------------------
# Runs

def tiny_args(data_dir, out_dir, *extra):
    return ['--n_layer=2', '--n_head=2', '--n_kv_head=1', '--n_embd=32', '--intermediate_size=64',
            '--vocab_size=320',
            '--block_size=32', '--global_batch_size=8', '--micro_batch_size=4', '--warmup_iters=2',
            '--eval_interval=1000', '--eval_batches=2', '--log_interval=1000', '--peak_flops=1e12',
            '--device=cpu', f'--data_dir={data_dir}', f'--out_dir={out_dir}', *extra]


def metrics(out_dir):
    """A run's metrics.jsonl records, as train.py reads them back (a line being written now is left
    out)."""
    return read_log(os.path.join(out_dir, 'metrics.jsonl'))


def fake_run(path, attention, grad_norms, n_layer=2, kd=False):
    path.mkdir(parents=True)
    (path / 'config.json').write_text(json.dumps(dict(attention=attention, n_layer=n_layer,
                                                      n_embd=32)))
    with open(path / 'metrics.jsonl', 'w') as f:
        for step, g in enumerate(grad_norms, 1):
            record = dict(step=step, loss=3.0 - step / 1000, grad_norm=g, lr=1e-3)
            if kd:
                record['kd_loss'] = 1.0 - step / 2000
            if step % 100 == 0:
                record['attn_logit_mean'] = -step / 1000
            f.write(json.dumps(record) + '\n')


def seal_here(report, change=None):
    """A report_dir whose seal.json (study/seal_study.py's form) seals the study's own files as they
    are here, one of them (`change`) sealed with other contents: a blind study may train there."""
    from study.study_records import file_sha256
    files = {p: file_sha256(ROOT / p) for p in
             ('model.py', 'train.py', 'study/sink_study.py', 'study/study_results.py',
              'config/sink_study.py')}
    if change:
        files[change] = '0' * 64
    Path(report).mkdir(parents=True)
    write_json(Path(report) / 'seal.json',
               dict(commit='a' * 40, committed='2026-01-01T00:00:00+00:00', files=files))
    return report
