"""
tools/bench.py's tokenizer section (docs/benchmarks.md, "Tokenizer"): prepare_data.py's throughput
on the same corpus with a Hugging Face tokenizer directory read two ways, at each --num_proc. One is
what prepare_data.py runs: the directory rebuilt as a tiktoken Encoding (lmkit/tokenizer.py). The
other is the `tokenizers` library encoding each chunk of documents (Tokenizer.from_file,
encode_batch). The two runs' shards must be the same bytes. The tokenizers are trained here, on
other files of the same corpus, so no hub is needed.
"""
import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

from lmkit.errors import RunError
from lmkit.tokenizer import LLAMA3_PATTERN, Tokenizer, load_tokenizer
from tools.tables import log, print_table, ratio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOT = '<|endoftext|>'
LIBRARIES = ('tiktoken rebuild', 'tokenizers')
# prepare_data.py run with load_tokenizer returning a TokenizersEncoding: argv[1] is
# prepare_data.py, the rest its flags. Its workers are spawned, so they unpickle the Encoding by its
# class's name.
WITH_TOKENIZERS = ("import runpy, sys; from lmkit import tokenizer; from tools import "
                   "tokenizer_bench; "
                   "tokenizer.load_tokenizer = tokenizer_bench.load_with_tokenizers; "
                   "runpy.run_path(sys.argv.pop(1), run_name='__main__')")


class TokenizersEncoding(Tokenizer):
    """A directory's rebuilt Tokenizer whose batches the `tokenizers` library encodes instead, from
    the directory's tokenizer.json (tokenizer_json). Everything else, meta.json's tokenizer
    included, is the rebuild's. As in encode_ordinary, special-token strings in a text are text."""

    def __init__(self, name, *, tokenizer_json, **state):
        import tokenizers
        super().__init__(name, **state)
        self.tokenizer_json = tokenizer_json
        self.library = tokenizers.Tokenizer.from_file(tokenizer_json)
        self.library.encode_special_tokens = True

    def __getstate__(self):
        return super().__getstate__() | dict(tokenizer_json=self.tokenizer_json)

    def encode_ordinary_batch(self, texts, *, num_threads=None):
        return [e.ids for e in self.library.encode_batch(texts, add_special_tokens=False)]


def load_with_tokenizers(spec):
    """load_tokenizer(spec) for a Hugging Face directory, as a TokenizersEncoding."""
    state = load_tokenizer(spec).__getstate__()
    return TokenizersEncoding(tokenizer_json=os.path.join(spec, 'tokenizer.json'), **state)


def stdlib_texts():
    """The UTF-8 .py files of the running Python's standard library, installed packages left out, in
    sorted order: the files prepare_data.py --source=stdlib reads."""
    texts = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()['stdlib'], '**', '*.py'),
                              recursive=True)):
        if not re.search(r'[/\\](site|dist)-packages[/\\]', path):
            try:
                with open(path, 'rb') as f:
                    texts.append(f.read().decode('utf-8'))
            except UnicodeDecodeError:  # a few test files, on purpose
                continue
    return texts


def pre_tokenizer(style):
    """The pre-tokenizer of a GPT-2, Llama-3 or SmolLM-style tokenizer.json."""
    from tokenizers import Regex, pre_tokenizers
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=style != 'llama3')
    first = dict(gpt2=[],
                 llama3=[pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior='isolated')],
                 smollm=[pre_tokenizers.Digits(individual_digits=True)])[style]
    return pre_tokenizers.Sequence(first + [byte_level]) if first else byte_level


def train_tokenizer(style, texts, vocab_size, directory):
    """A byte-level BPE of `style` trained on texts, saved as a Hugging Face directory whose
    tokenizer_config.json names <|endoftext|> as its EOS."""
    from tokenizers import Tokenizer as Library, decoders, models, pre_tokenizers, trainers
    tok = Library(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizer(style), decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOT], show_progress=False))
    os.makedirs(directory)
    tok.save(os.path.join(directory, 'tokenizer.json'))
    with open(os.path.join(directory, 'tokenizer_config.json'), 'w') as f:
        json.dump(dict(eos_token=EOT), f)
    return directory


def prepare(library, corpus, directory, out_dir, num_proc):
    """(tokens/s prepare_data.py reports, tokens written): one run as a process, on `library`."""
    flags = [f'--source={corpus}', f'--tokenizer={directory}', f'--out_dir={out_dir}',
             f'--num_proc={num_proc}', '--val_every=10']
    script = os.path.join(ROOT, 'prepare_data.py')
    command = ([sys.executable, '-c', WITH_TOKENIZERS, script] if library == 'tokenizers'
               else [sys.executable, script])
    done = subprocess.run(command + flags, cwd=ROOT, capture_output=True, text=True)
    found = re.search(r'train ([\d,]+) tokens .* val ([\d,]+) tokens .*; ([\d,]+) tokens/s',
                      done.stdout)
    if done.returncode or not found:
        raise RunError(f'prepare_data.py on {library} failed: '
                       f'{(done.stderr.strip().splitlines() or ["no output"])[-1]}')
    train, val, rate = (int(group.replace(',', '')) for group in found.groups())
    return rate, train + val


def shard_bytes(out_dir):
    return {name: open(os.path.join(out_dir, name), 'rb').read()
            for name in sorted(os.listdir(out_dir)) if name.endswith('.bin')}


def timed_pair(corpus, directory, num_proc, repeats, tmp):
    """{library: [tokens/s of each repeat]}, the libraries alternating which runs first; a RunError
    unless every run wrote the same shards."""
    rates, first = {library: [] for library in LIBRARIES}, None
    for repeat in range(repeats):
        for library in LIBRARIES[::-1] if repeat % 2 else LIBRARIES:
            out_dir = os.path.join(tmp, f'{os.path.basename(directory)}_{library.split()[0]}'
                                        f'_{num_proc}_{repeat}')
            rate, tokens = prepare(library, corpus, directory, out_dir, num_proc)
            rates[library].append(rate)
            first = first or shard_bytes(out_dir)
            if shard_bytes(out_dir) != first:
                raise RunError(f'{library} wrote other ids than the first run, from {directory}')
    return rates, tokens


def bench_tokenizer(args, device):
    """prepare_data.py's tokens/s with each style's directory rebuilt as a tiktoken Encoding and
    with `tokenizers`, at --num_proc=1 and 2; the ids must be equal."""
    try:
        import tokenizers
    except ImportError:
        log('tokenizer: skipped: needs the tokenizers package (pip install -r '
            'requirements-test.txt)')
        return
    documents = stdlib_texts()
    timed = documents[::args.tokenizer_every]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, 'corpus.jsonl')
        with open(corpus, 'w') as f:
            f.writelines(json.dumps(dict(text=text)) + '\n' for text in timed)
        size = sum(len(text.encode()) for text in timed)
        for style in args.tokenizer_styles:
            log(f'  tokenizer: training a {style}-style BPE')
            directory = train_tokenizer(style, documents[1::8][:len(timed)],
                                        args.tokenizer_vocab, os.path.join(tmp, style))
            for num_proc in (1, 2):
                rates, tokens = timed_pair(corpus, directory, num_proc, args.tokenizer_repeats,
                                           tmp)
                best = {library: max(rates[library]) for library in LIBRARIES}
                mb_s = [best[library] * size / tokens / 1e6 for library in LIBRARIES]
                rows.append([style, str(num_proc), f'{tokens:,}',
                             *(f'{rate:,} ({mb:.2f} MB/s)' for rate, mb in zip(best.values(),
                                                                               mb_s)),
                             ratio(best[LIBRARIES[0]], best[LIBRARIES[1]]), 'yes'])
                log(f'  tokenizer: {style} --num_proc={num_proc}: {rates}')
    print_table('Tokenizer: prepare_data.py with the tiktoken rebuild vs `tokenizers`',
                f'{len(timed):,} files of the standard library ({size / 1e6:.1f} MB; every '
                f'{args.tokenizer_every}th of the {len(documents):,} of --source=stdlib) as a '
                '.jsonl, --val_every=10; byte-level BPEs of vocabulary '
                f'{args.tokenizer_vocab:,} trained here on files 2, 10, 18, ... of them, one per '
                'pre-tokenizer style. tokens/s as prepare_data.py reports it (after opening the '
                f'stream; the workers\' start included), the best of {args.tokenizer_repeats} '
                'runs, the two alternating; tokenizers ' f'{tokenizers.__version__}\'s '
                'encode_batch uses its own threads in each process. Same ids: every run\'s '
                'shards are the same bytes.',
                ['pre-tokenizer', '--num_proc', 'tokens', 'tiktoken rebuild tokens/s',
                 'tokenizers tokens/s', 'rebuild / tokenizers (speed)', 'same ids'], rows)


if __name__ == '__main__':
    from tools.tables import not_a_command
    not_a_command(__doc__)
