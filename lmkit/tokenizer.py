"""
Tokenizers: Hugging Face's byte-level BPE tokenizers (GPT-2, Llama-3, Qwen, SmolLM style), tiktoken
BPE files and the 'bytes' tokenizer, each rebuilt from its own files as a tiktoken Encoding that
gives the ids Hugging Face's does (load_tokenizer); a document's ids with its boundary tokens
(encode_document, encode_documents); what meta.json records about a tokenizer (tokenizer_info).
It imports NumPy, tiktoken, errors.py and data_meta.py only, so importing it stays cheap
(prepare_data.py's tokenizer workers do). docs/data.md, "Tokenizers", has the rules. It is a
rebuild rather than the `tokenizers` library itself because prepare_data.py runs 4.5-10x faster
on it, with the same ids (docs/benchmarks.md, "Tokenizer").
"""
import base64
import functools
import hashlib
import json
import os
import re
import unicodedata

import numpy as np
import tiktoken

from lmkit.data_meta import TOKENIZER_FILES
from lmkit.errors import RunError

# -----------------------------------------------------------------------------------------------
# Tokenizers, all as tiktoken Encodings

# A Hugging Face tokenizer is rebuilt from what its own files say, never from the model's name or
# type:
#   tokenizer.json            the BPE vocabulary and merges, the normalizer, the pre-tokenizer
#                             (turned into one regex), the added tokens, and the post-processor
#                             (the special tokens put around a text)
#   tokenizer_config.json,    bos_token and eos_token; add_bos_token / add_eos_token;
#   special_tokens_map.json   tokenizer_class, whose defaults transformers applies where these
#                             files say nothing
#   vocab.json + merges.txt   a "slow" tokenizer: the vocabulary; its tokenizer_class gives the
#                             regex
#   original/tokenizer.model  Meta's Llama-3 tiktoken file, with the conventions of Meta's
#                             tokenizer.py
# config.json is not read. tiktoken runs byte-level BPE only; anything else, and any setting these
# files hold that tiktoken cannot reproduce exactly, is refused with a message naming what was
# found. The files' names come from lmkit/data_meta.py, where meta.json's record of their sha256s
# is defined: a file the loader reads is a file that record covers.
(TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, VOCAB_JSON, MERGES_TXT, ADDED_TOKENS_JSON,
 TIKTOKEN_MODEL) = TOKENIZER_FILES
# Files of the formats tiktoken cannot run, named in the refusal of a directory that has only those
OTHER_FORMATS = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "tekken.json",
                 "vocab.txt", "tiktoken.model")

# Pre-tokenization regexes: text is first split into pieces with these, then BPE runs inside each
# piece. GPT-2: the regex built into Hugging Face's ByteLevel pre-tokenizer (use_regex=true); also
# SmolLM's, GPT-NeoX's.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# GPT-2's regex applied inside the pieces of a Digits pre-tokenizer (SmolLM, StarCoder:
# Sequence[Digits, ByteLevel]). Digits cuts the text before and after every digit
# (individual_digits=true) or digit run, so
#   - a digit or run is a piece of its own: ' ?\p{N}+' becomes one digit (a run), without the
#     leading space;
#   - a whitespace run just before a digit ends its piece, where '\s+(?!\S)' takes the whole run
#     (as at the end of a text): the lookahead becomes "not followed by a character that is
#     neither a space nor a digit";
#   - every other alternative stops at a digit by itself, the punctuation class once digits are
#     taken out of it.
# A "digit" is what Digits takes for one, Rust's char::is_numeric: \p{N} and 13 code points of
# Unicode 16 that the regex engines' older tables do not know yet (Kirat Rai U+11DE0-11DE9,
# U+16FF4-16FF6; DIGIT_EXTRA). Inside a run of digits GPT-2's regex still tells the two kinds apart
# (\p{N}+ and a "punctuation" run), so runs do too. tests/test_tokenizer.py checks these splits
# piece by piece against the `tokenizers` library.
DIGIT_EXTRA = r"\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6}"
GPT2_DIGITS_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|[\p{N}" + DIGIT_EXTRA
                       + r"]| ?[^\s\p{L}\p{N}" + DIGIT_EXTRA
                       + r"]+|\s+(?![^\s\p{N}" + DIGIT_EXTRA + r"])|\s+")
GPT2_DIGIT_RUNS_PATTERN = GPT2_DIGITS_PATTERN.replace(r"|[\p{N}" + DIGIT_EXTRA + "]|",
                                                      r"|\p{N}+|[" + DIGIT_EXTRA + "]+|", 1)
# Llama 3: the cl100k-style pattern of Meta's tokenizer.py (also the Split regex in its
# tokenizer.json).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen1.5 / Qwen2: the same, except that digits are split one at a time (\p{N} instead of
# \p{N}{1,3}).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The byte tokenizer has no merges, so every split gives the same ids; fixed-size pieces are the
# fastest.
BYTES_PATTERN = r"[\s\S]{1,256}"

# The three conventions this repo had before it read tokenizers' files (an Encoding whose
# conventions are exactly one of these keeps its name, so its meta.json sha256, and with it data and
# checkpoints made before, still match):
#   llama3: <|begin_of_text|> before each document (the HF Llama-3 tokenizer prepends it to
#           every text)
#   qwen2:  <|endoftext|> after each document (Qwen has no BOS token; <|endoftext|> ends a document)
#   bytes:  <|endoftext|> after each document (the GPT-2 / nanoGPT convention)
# Every other tokenizer is family "bpe", and its conventions are part of its sha256.
FAMILIES = {
    "bytes": dict(pattern=BYTES_PATTERN, nfc=False, bos=None, eos="<|endoftext|>"),
    "llama3": dict(pattern=LLAMA3_PATTERN, nfc=False, bos="<|begin_of_text|>", eos=None),
    "qwen2": dict(pattern=QWEN2_PATTERN, nfc=True, bos=None, eos="<|endoftext|>"),
}

# What transformers assumes for a tokenizer_class where tokenizer_config.json /
# special_tokens_map.json say nothing (the defaults of the classes' __init__ in transformers;
# "...Fast" names the same class). pattern and nfc are used only for vocab.json + merges.txt: with a
# tokenizer.json the `tokenizers` library follows the file, and so do we. LlamaTokenizer rebuilds
# the post-processor from add_bos_token (default true) whatever tokenizer.json says.
TOKENIZER_CLASSES = {
    "GPT2Tokenizer": dict(pattern=GPT2_PATTERN, nfc=False, bos_token="<|endoftext|>",
                          eos_token="<|endoftext|>"),
    "Qwen2Tokenizer": dict(pattern=QWEN2_PATTERN, nfc=True, bos_token=None,
                           eos_token="<|endoftext|>"),
    "LlamaTokenizer": dict(bos_token="<s>", eos_token="</s>", add_bos_token=True,
                           add_eos_token=False),
}  # any other class (PreTrainedTokenizerFast: Llama-3's) assumes nothing
NOT_BYTE_LEVEL = ("only byte-level BPE tokenizers (GPT-2, Llama-3, Qwen, SmolLM style) can be "
                  "represented in tiktoken")


class Tokenizer(tiktoken.Encoding):
    """A tiktoken Encoding plus what tiktoken does not model, as the tokenizer's files say: nfc (NFC
    first, as Qwen's normalizer), inline (added tokens matched inside ordinary text, as Hugging Face
    does), prefix and suffix (what add_special_tokens puts around a text), bos_token and eos_token,
    missing (the single bytes the vocabulary lacks, dropped: encode_lossy) and unk (their unk token
    instead, where declared: encode_unk). A document is wrapped as a text is, or gets the EOS after
    it. Special tokens in text are encoded as ordinary text, so data cannot forge a boundary (the
    one deliberate difference from Hugging Face). docs/data.md, "Tokenizers"."""

    def __init__(self, name, *, pat_str, mergeable_ranks, special_tokens, nfc=False, inline=(),
                 inline_normalized=(), bos_token=None, eos_token=None, prefix=(), suffix=(),
                 unk=None):
        super().__init__(name, pat_str=pat_str, mergeable_ranks=mergeable_ranks,
                         special_tokens=special_tokens)
        self.nfc, self.inline, self.inline_normalized = nfc, tuple(inline), tuple(inline_normalized)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.prefix, self.suffix = tuple(prefix), tuple(suffix)
        self.doc_prefix = self.prefix
        self.doc_suffix = (self.suffix if self.prefix or self.suffix
                           else (eos_token,) if eos_token else ())
        # lm-evaluation-harness's prefix token (the context of an empty-context request): BOS, else
        # EOS
        self.prefix_token = bos_token if bos_token is not None else eos_token
        self._raw_inline = tuple(sorted(t for t in self.inline if t not in self.inline_normalized))
        self._normalized_inline = tuple(sorted(self.inline_normalized))
        self.missing = bytes(missing_bytes(mergeable_ranks))
        self.unk = tuple(unk) if unk else None
        self._missing_byte = re.compile(b"[" + re.escape(self.missing)
                                        + b"]") if self.missing else None
        self._missing_runs = re.compile(b"[" + re.escape(self.missing)
                                        + b"]+") if self.missing else None

    def __getstate__(self):  # pickled whole (to the tokenizer workers), conventions included
        return dict(name=self.name, pat_str=self._pat_str, mergeable_ranks=self._mergeable_ranks,
                    special_tokens=self._special_tokens, nfc=self.nfc, inline=self.inline,
                    inline_normalized=self.inline_normalized, bos_token=self.bos_token,
                    eos_token=self.eos_token, prefix=self.prefix, suffix=self.suffix, unk=self.unk)

    def ids(self, names):
        return [self._special_tokens[name] for name in names]

    def encode_ordinary(self, text):
        return self._encode(text, self._raw_inline, self._normalized_inline)

    def encode(self, text, *, allowed_special=frozenset(), disallowed_special="all"):
        """tiktoken's encode (special-token strings raise unless allowed or disallowed_special=()),
        with this tokenizer's normalisation and inline tokens; allowed special tokens are matched
        like inline ones."""
        allowed = self.special_tokens_set if allowed_special == "all" else set(allowed_special)
        if disallowed_special == "all":
            disallowed_special = self.special_tokens_set - allowed - set(self.inline)
        if disallowed_special:
            match = split_regex(tuple(sorted(disallowed_special))).search(text)
            if match:
                raise ValueError(f"text contains the special token {match.group()!r}; pass "
                                 "allowed_special or disallowed_special=() (or use "
                                 "encode_ordinary)")
        return self._encode(text, tuple(sorted(allowed | set(self._raw_inline))),
                            self._normalized_inline)

    def encode_ordinary_batch(self, texts, *, num_threads=1):
        """encode_ordinary of each text, one after the other in this thread (tiktoken's own runs a
        thread pool; prepare_data.py's parallelism is its processes)."""
        return [self.encode_ordinary(text) for text in texts]

    def encode_to_numpy(self, text, **kwargs):
        return np.array(self.encode(text, **kwargs), dtype=np.uint32)

    def dropped_bytes(self, text):
        """How many bytes of text encode_ordinary drops (or, with an unk_token, encodes as unk):
        those the vocabulary has no token for."""
        if not self.missing:
            return 0
        pieces = [utf8(piece) for piece, token
                  in self._texts(text, self._raw_inline, self._normalized_inline) if not token]
        return sum(len(data) - len(data.translate(None, self.missing)) for data in pieces)

    def _texts(self, text, raw, normalized):
        """Hugging Face's order: tokens matched in the raw text, then each piece between them
        normalised, then tokens matched in the normalised pieces. Yields (piece of ordinary text,
        None) or ('', token)."""
        for piece, token in split_on(text, raw):
            if token:
                yield piece, token
                continue
            if self.nfc:
                piece = unicodedata.normalize("NFC", piece)
            for sub, token in split_on(piece, normalized):
                if token or sub:
                    yield sub, token

    def _encode(self, text, raw, normalized):
        """The tokens _texts finds, and pre-tokenization and BPE (tiktoken) of the text between
        them."""
        ids = []
        for piece, token in self._texts(text, raw, normalized):
            if token:
                ids.append(self._special_tokens[token])
            elif self.missing and self._missing_byte.search(utf8(piece)):
                ids += self.encode_unk(piece) if self.unk else self.encode_lossy(piece)
            else:
                ids += super().encode_ordinary(piece)
        return ids

    def encode_lossy(self, text):
        """encode_ordinary of text holding bytes the vocabulary lacks, as Hugging Face's byte-level
        BPE does it: the pre-tokenizer cuts the text into pieces, BPE drops from each piece the
        bytes it has no token for (in `tokenizers`, BPE::merge_word skips a symbol without an id
        when there is no unk_token and no byte fallback) and merges what is left, across the gaps.
        tiktoken cannot drop a byte: the text is encoded with the missing bytes as tokens that merge
        with nothing, and each piece holding one (lossy_pieces) is encoded again without them."""
        data = utf8(text)
        text = data.decode()
        pieces, enc = self.lossy_pieces(text, data), self._with_missing
        ids, pos, end = [], 0, 0
        tokens = enc.encode_ordinary(text)
        for token, token_bytes in zip(tokens, enc.decode_tokens_bytes(tokens)):
            if pos in pieces:  # (a piece starts with a token: tokens never cross pieces)
                end = pieces[pos]
                if kept := data[pos:end].translate(None, self.missing):
                    ids += self._encode_single_piece(kept)
            if pos >= end:
                ids.append(token)
            pos += len(token_bytes)
        return ids

    def encode_unk(self, text):
        """encode_ordinary of text holding bytes the vocabulary lacks, as Hugging Face's byte-level
        BPE does it with an unk_token: BPE::merge_word in `tokenizers` makes each symbol without an
        id an unk symbol, one for a whole run of them within a pre-tokenized piece when fuse_unk is
        set, and no merge names it, so BPE merges each side of it on its own. tiktoken does the same
        with the missing bytes as tokens that merge with nothing (_with_missing); each is then
        replaced by the unk id, or, fused, each that starts a run (unk_runs)."""
        _, unk_id, fuse = self.unk
        data = utf8(text)
        text = data.decode()
        starts, enc = self.unk_runs(text, data) if fuse else None, self._with_missing
        ids, pos = [], 0
        tokens = enc.encode_ordinary(text)
        for token, token_bytes in zip(tokens, enc.decode_tokens_bytes(tokens)):
            if token <= self.max_token_value:
                ids.append(token)
            elif starts is None or pos in starts:
                ids.append(unk_id)
            pos += len(token_bytes)
        return ids

    def unk_runs(self, text, data):
        """The byte offsets in text (UTF-8: data) where a run of missing bytes within one piece
        starts, the pieces cut by tiktoken's own regex engine: an Encoding whose only merges are the
        substrings of those runs encodes all else byte by byte and each such run as one token (any
        two of its neighbouring parts can merge)."""
        runs = {m.group() for m in self._missing_runs.finditer(data)}
        ranks = {bytes([b]): b for b in range(256)}
        for s in sorted({r[i:j] for r in runs for i in range(len(r))
                         for j in range(i + 2, len(r) + 1)}, key=len):
            ranks[s] = len(ranks)
        probe = tiktoken.Encoding("runs", pat_str=self._pat_str, mergeable_ranks=ranks,
                                  special_tokens={})
        starts, pos = set(), 0
        for piece in probe.decode_tokens_bytes(probe.encode_ordinary(text)):
            if piece[0] in self.missing:
                starts.add(pos)
            pos += len(piece)
        return starts

    def lossy_pieces(self, text, data):
        """{start: end}: the byte spans of text's (UTF-8: data) pieces that hold a missing byte, as
        tiktoken's own regex engine cuts them (so no other engine's Unicode tables come in). An
        Encoding whose only merges are the substrings around the missing bytes, up to each one's
        reach in length, encodes all else byte by byte and a piece holding missing bytes as one
        token once that token is shorter than half their reach (two neighbours in one piece would
        otherwise have merged); the missing bytes of a longer token get twice the reach."""
        reach = dict.fromkeys((m.start() for m in self._missing_byte.finditer(data)), 16)
        while True:
            around = {data[i:j] for p, r in reach.items() for i in range(max(0, p - r + 1), p + 1)
                      for j in range(p + 1, min(len(data), i + r) + 1)}
            ranks = {bytes([b]): b for b in range(256)}
            for s in sorted(around, key=len):
                ranks.setdefault(s, len(ranks))
            probe = tiktoken.Encoding("pieces", pat_str=self._pat_str, mergeable_ranks=ranks,
                                      special_tokens={})
            pieces, pos, grown = {}, 0, False
            for piece in probe.decode_tokens_bytes(probe.encode_ordinary(text)):
                if self._missing_byte.search(piece):
                    pieces[pos] = pos + len(piece)
                    inside = [pos + m.start() for m in self._missing_byte.finditer(piece)]
                    if len(piece) >= min(reach[p] for p in inside) // 2:
                        grown = True
                        for p in inside:
                            reach[p] *= 2
                pos += len(piece)
            if not grown:
                return pieces

    @functools.cached_property
    def _with_missing(self):
        """This Encoding with tokens for the bytes its vocabulary lacks, ranked last: they merge
        with nothing."""
        first = self.max_token_value + 1
        return tiktoken.Encoding("with_missing", pat_str=self._pat_str, special_tokens={},
                                 mergeable_ranks=(
            self._mergeable_ranks | {bytes([b]): first + i for i, b in enumerate(self.missing)}))


def utf8(text):
    """text as UTF-8, a lone surrogate (which UTF-8 cannot hold) replaced by U+FFFD, as tiktoken's
    encode does."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


@functools.lru_cache(maxsize=16)
def split_regex(tokens):
    """A regex matching any of `tokens`, the longest where several start at the same position
    (Python's re tries alternatives in order), so leftmost-longest like the Aho-Corasick matcher of
    Hugging Face's added tokens."""
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def split_on(text, tokens):
    """[(piece, None) or ('', token)] covering text, cut where one of `tokens` (a sorted tuple)
    occurs."""
    if not tokens:
        return [(text, None)]
    out, start = [], 0
    for match in split_regex(tokens).finditer(text):
        out += [(text[start:match.start()], None), ("", match.group())]
        start = match.end()
    return out + [(text[start:], None)]


def gpt2_unicode_to_byte():
    """Byte-level BPE vocabularies (GPT-2, Llama-3's tokenizer.json, Qwen) spell each byte as one
    printable character: bytes that are printable in Latin-1 stand for themselves, the other 68 are
    mapped in order to chr(256), chr(257), ... (GPT-2's bytes_to_unicode). This returns the inverse
    map, char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def read_tiktoken_file(path):
    """A tiktoken BPE file (Llama-3's original/tokenizer.model): one 'base64(token bytes) rank' per
    line. Parsed here rather than with tiktoken.load.load_tiktoken_bpe, which caches files by path
    in /tmp and would silently return stale ranks after a file at the same path changes."""
    ranks = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:  # also binascii.Error
                raise RunError(f"{path}:{line_no}: not a tiktoken BPE file (expected 'base64-token "
                               "rank' lines; SentencePiece models such as Llama-2's are not "
                               f"supported: {NOT_BYTE_LEVEL})")
    if not ranks:
        raise RunError(f"{path}: empty tokenizer file")
    require_every_byte(ranks, path, "tiktoken (Meta's tokenizer.py) cannot encode text holding "
                                    "them")
    return ranks


def llama3_special_tokens(n_ranks):
    """The 256 special tokens that Meta's Llama-3 tokenizer.py appends after the BPE ranks
    (128000-128255 for the real vocabulary); used when a checkpoint has no tokenizer.json naming
    them."""
    names = (["<|begin_of_text|>", "<|end_of_text|>"]
             + [f"<|reserved_special_token_{i}|>" for i in range(4)]
             + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>",
                "<|eot_id|>"]
             + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
    return {name: n_ranks + i for i, name in enumerate(names)}


def meta_llama3_conventions():
    """Meta's tokenizer.py: its regex, BOS <|begin_of_text|> before a text, EOS <|end_of_text|>, no
    normaliser."""
    return dict(pattern=LLAMA3_PATTERN, nfc=False, bos_token="<|begin_of_text|>",
                eos_token="<|end_of_text|>", prefix=["<|begin_of_text|>"], suffix=[])


def missing_bytes(ranks):
    return [b for b in range(256) if bytes([b]) not in ranks]


def require_every_byte(ranks, where, why):
    missing = missing_bytes(ranks)
    if missing:
        raise RunError(f"{where}: the vocabulary lacks {len(missing)} of the 256 single bytes "
                       f"(e.g. byte {missing[0]}); {why}")


def byte_level_bpe_ranks(vocab, merges, special_tokens, where):
    """tiktoken ranks from a Hugging Face byte-level BPE (vocab: token string -> id, merges: 'a b'
    lines or [a, b] pairs); tokens in special_tokens are left out (they are tiktoken special
    tokens). The rank of a token is its id. tiktoken merges the adjacent pair whose merged token has
    the lowest rank, HF merges the pair listed first in merges; the two agree when ids grow with
    merge order, as in vocabularies built by BPE training (GPT-2, Llama-3, Qwen), so that is checked
    instead of silently tokenizing differently."""
    to_byte = gpt2_unicode_to_byte()
    special_ids = set(special_tokens.values())
    as_bytes = {}
    for token, i in vocab.items():
        if i in special_ids or token in special_tokens:
            continue
        try:
            as_bytes[token] = bytes(to_byte[c] for c in token)
        except KeyError:
            raise RunError(f"{where}: token {token!r} is not byte-level BPE; "
                           f"{NOT_BYTE_LEVEL}") from None
    ranks = {as_bytes[token]: i for token, i in vocab.items() if token in as_bytes}
    if len(ranks) != len(as_bytes) or len(set(ranks.values())) != len(ranks):
        raise RunError(f"{where}: two tokens share a byte string or an id; not a BPE vocabulary "
                       "tiktoken can hold")
    last = -1
    for merge in merges:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        if left not in as_bytes or right not in as_bytes or left + right not in as_bytes:
            raise RunError(f"{where}: merge {left!r} + {right!r} names a token that is not in the "
                           "vocabulary")
        rank = vocab[left + right]
        if rank < last:
            raise RunError(f"{where}: merge {left!r} + {right!r} is out of id order; tiktoken "
                           "cannot reproduce this tokenizer exactly")
        last = rank
    return ranks


def load_tokenizer(spec):
    """A Tokenizer (a tiktoken.Encoding) for --tokenizer=spec:
    'bytes'       256 byte tokens + <|endoftext|> = 256; needs no file.
    a file        a tiktoken BPE file (Meta's Llama-3 original/tokenizer.model), with Meta's
                  conventions.
    a directory   a Hugging Face model or tokenizer directory (config.json optional):
                  tokenizer.json, else vocab.json + merges.txt, else original/tokenizer.model (see
                  the top of this section).
    Its name is its family: one of FAMILIES when its conventions are exactly that one's, else
    'bpe'."""
    if spec == "bytes":
        return make_tokenizer(spec, {bytes([b]): b for b in range(256)}, {"<|endoftext|>": 256},
                              dict(pattern=BYTES_PATTERN, nfc=False, bos_token=None,
                                   eos_token="<|endoftext|>"))
    if os.path.isfile(spec):
        ranks = read_tiktoken_file(spec)
        return make_tokenizer(spec, ranks, llama3_special_tokens(len(ranks)),
                              meta_llama3_conventions())
    if os.path.isdir(spec):
        return load_tokenizer_directory(spec)
    raise RunError(f"--tokenizer={spec!r}: unknown tokenizer; expected 'bytes', a tiktoken BPE "
                   "file, or a Hugging Face model or tokenizer directory")


def conventions_of(enc):
    """Everything besides the vocabulary and the special tokens that decides the ids this repo
    writes (shards) and scores (eval_zeroshot.py): what sha256 covers for family 'bpe', and what
    FAMILIES' names stand for."""
    conventions = dict(pattern=enc._pat_str, nfc=enc.nfc, inline=sorted(enc.inline),
                       inline_normalized=sorted(enc.inline_normalized), prefix=list(enc.prefix),
                       suffix=list(enc.suffix),
                       document=[list(enc.doc_prefix), list(enc.doc_suffix)],
                       prefix_token=enc.prefix_token)
    # only where it fires, so the sha256 of a tokenizer without one is what it was before unk
    # existed
    if enc.unk:
        conventions["unk"] = list(enc.unk)
    return conventions


def family_conventions(family):
    f = FAMILIES[family]
    return dict(pattern=f["pattern"], nfc=f["nfc"], inline=[], inline_normalized=[],
                prefix=[f["bos"]] if f["bos"] else [], suffix=[],
                document=[[f["bos"]] if f["bos"] else [], [f["eos"]] if f["eos"] else []],
                prefix_token=f["bos"] or f["eos"])


def make_tokenizer(where, ranks, special_tokens, conv):
    """The Tokenizer, after checking that every special token its conventions use is one of its
    tokens."""
    conv = dict(conv)
    pattern = conv.pop("pattern")
    try:
        enc = Tokenizer("bpe", pat_str=pattern, mergeable_ranks=ranks,
                        special_tokens=special_tokens, **conv)
    except ValueError as e:  # tiktoken's regex engine cannot compile the pattern
        raise RunError(f"{where}: pre-tokenizer regex {pattern!r} is not supported by tiktoken: "
                       f"{e}") from None
    # the tokens it uses: around texts and documents, and lm-evaluation-harness's prefix token (BOS,
    # else EOS)
    roles = ([("the token put before a text", t) for t in enc.prefix]
             + [("the token put after a text", t) for t in enc.suffix])
    roles += ([("eos_token", enc.eos_token)]
              if enc.eos_token in enc.doc_suffix or enc.bos_token is None else [])
    roles += [("bos_token", enc.bos_token)]
    listed = ", ".join(list(special_tokens)[:5]) + (", ..." if len(special_tokens) > 5
                                                    else "") or "none"
    for role, name in roles:
        if name is not None and name not in special_tokens:
            raise RunError(f"{where}: {role} {name!r} is not one of its special tokens "
                           f"({len(special_tokens)}: {listed})")
    if not enc.doc_prefix and not enc.doc_suffix:
        raise RunError(f"{where}: puts no special token around a text and names no eos_token, so "
                       "documents cannot be separated; name one in tokenizer_config.json "
                       "(\"eos_token\")")
    conventions = conventions_of(enc)
    enc.name = next((name for name in FAMILIES if family_conventions(name) == conventions), "bpe")
    return enc


def token_content(value):
    """A token as tokenizer_config.json / special_tokens_map.json write it: a string, an AddedToken
    dict, or null."""
    return value.get("content") if isinstance(value, dict) else value


def load_tokenizer_directory(model_dir):
    """The Tokenizer of a Hugging Face directory, from its own files (see the top of this
    section)."""
    def path(*names):
        return os.path.join(model_dir, *names)

    config, special_map = (read_json(path(name)) if os.path.isfile(path(name)) else {}
                           for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP))
    tiktoken_file = path(TIKTOKEN_MODEL)
    if os.path.isfile(path(TOKENIZER_JSON)):
        return tokenizer_json_directory(model_dir, config, special_map, tiktoken_file)

    if os.path.isfile(tiktoken_file):  # Meta's layout without tokenizer.json: Meta's conventions
        decoder = config.get("added_tokens_decoder", {})
        ranks = read_tiktoken_file(tiktoken_file)
        special_tokens = ({t["content"]: int(i) for i, t in decoder.items()}
                          or llama3_special_tokens(len(ranks)))
        return make_tokenizer(model_dir, ranks, special_tokens, meta_llama3_conventions())

    if os.path.isfile(path(VOCAB_JSON)) and os.path.isfile(path(MERGES_TXT)):
        return vocab_merges_directory(model_dir, config, special_map)

    found = [name for name in OTHER_FORMATS if os.path.isfile(path(name))]
    if found:
        raise RunError(f"--tokenizer={model_dir}: has {', '.join(found)} but no tokenizer.json or "
                       "vocab.json + merges.txt (SentencePiece, WordPiece or another format); "
                       f"{NOT_BYTE_LEVEL}")
    raise RunError(f"--tokenizer={model_dir}: has no tokenizer.json, vocab.json + merges.txt, or "
                   f"original/tokenizer.model")


def read_json(path):
    """A JSON file's contents; a RunError naming the file where it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: cannot read: {e}") from None


def tokenizer_class_key(class_name):
    """The key of TOKENIZER_CLASSES that a tokenizer_class stands for ("...Fast" names the same
    class), or None."""
    return class_name.removesuffix("Fast") if class_name else None


def declared_tokens(model_dir, config, special_map, defaults):
    """(bos_token, eos_token): each from tokenizer_config.json, special_tokens_map.json (they must
    agree), else what transformers' tokenizer_class assumes (defaults)."""
    tokens = []
    for key in ("bos_token", "eos_token"):
        found = {token_content(f[key]) for f in (config, special_map) if key in f}
        if len(found) > 1:
            raise RunError(f"{model_dir}: tokenizer_config.json and special_tokens_map.json name "
                           f"different {key}s: {sorted(found, key=str)}")
        tokens.append(found.pop() if found else defaults.get(key))
    return tuple(tokens)


def added_around(flags, bos_token, eos_token):
    """(prefix, suffix): the tokens that add_bos_token / add_eos_token (in flags) put around a text;
    a flag whose token is not named adds nothing (transformers ignores it)."""
    return ([bos_token] if flags.get("add_bos_token") and bos_token else [],
            [eos_token] if flags.get("add_eos_token") and eos_token else [])


def tokenizer_json_directory(model_dir, config, special_map, tiktoken_file):
    """The Tokenizer of a directory with a tokenizer.json, which tokenizer_config.json,
    special_tokens_map.json and original/tokenizer.model (tiktoken_file), where present, must agree
    with."""
    where = os.path.join(model_dir, TOKENIZER_JSON)
    tokenizer_json = read_json(where)
    class_name = config.get("tokenizer_class")
    class_defaults = TOKENIZER_CLASSES.get(tokenizer_class_key(class_name), {})
    bos_token, eos_token = declared_tokens(model_dir, config, special_map, class_defaults)
    model = byte_level_bpe_model(tokenizer_json, where)
    added = tokenizer_json.get("added_tokens") or []
    special_tokens = {t["content"]: t["id"] for t in added}
    nfc = normalizer_is_nfc(tokenizer_json.get("normalizer"), where)
    pattern = pre_tokenizer_pattern(tokenizer_json.get("pre_tokenizer"), where)
    ranks = byte_level_bpe_ranks(model.get("vocab") or {}, model.get("merges") or [],
                                 special_tokens, where)
    unk = unk_convention(model, ranks, where)
    if os.path.isfile(tiktoken_file) and read_tiktoken_file(tiktoken_file) != ranks:
        raise RunError(f"{model_dir}: original/tokenizer.model and tokenizer.json hold different "
                       "vocabularies")
    prefix, suffix = template_tokens(tokenizer_json.get("post_processor"), special_tokens, where)
    # transformers rebuilds the template from add_bos_token / add_eos_token when
    # tokenizer_config.json sets them (and LlamaTokenizer always); the `tokenizers` library and
    # older transformers keep tokenizer.json's. When the two disagree, whether a text starts with
    # BOS depends on the version: refused.
    flags = {key: config.get(key, class_defaults.get(key))
             for key in ("add_bos_token", "add_eos_token")
             if key in config or key in class_defaults}
    if flags:
        wanted = added_around(flags, bos_token, eos_token)
        if wanted != (prefix, suffix):
            raise RunError(f"{model_dir}: tokenizer_config.json "
                           f"({class_name or 'no tokenizer_class'}, "
                           f"{', '.join(f'{k}={v}' for k, v in flags.items())}) puts "
                           f"{around(*wanted)} around a text, tokenizer.json's post-processor "
                           f"{around(prefix, suffix)}; transformers versions differ in which "
                           "applies, so make them agree")
    inline, inline_normalized = inline_tokens(added, nfc, where)
    return make_tokenizer(model_dir, ranks, special_tokens, dict(
        pattern=pattern, nfc=nfc, inline=inline, inline_normalized=inline_normalized,
        bos_token=bos_token, eos_token=eos_token, prefix=prefix, suffix=suffix, unk=unk))


def byte_level_bpe_model(tokenizer_json, where):
    """tokenizer.json's model, after refusing one whose ids tiktoken cannot reproduce: not a BPE, a
    SentencePiece-style BPE, or one with dropout."""
    model = tokenizer_json.get("model") or {}
    model_type = model.get("type", "BPE" if "merges" in model else None)
    if model_type != "BPE":
        raise RunError(f"{where}: a {model_type} model; {NOT_BYTE_LEVEL}")
    vocab = model.get("vocab") or {}
    # byte_fallback spells a symbol the vocabulary lacks as the <0xNN> tokens of its UTF-8 bytes
    # (SentencePiece's way; BPE::merge_word in `tokenizers`). A byte-level BPE's symbols are bytes
    # already and it has no <0xNN> tokens, so there it never fires and changes no id (a symbol it
    # lacks goes on to unk_token, else is dropped): some converters set it on byte-level BPEs
    # (transformers 4.57's GGUF converter, on SmolLM2's).
    pre_steps = [p.get("type") for p in steps(tokenizer_json.get("pre_tokenizer"), "pretokenizers")]
    inert_fallback = pre_steps[-1:] == ["ByteLevel"] and \
        not any(re.fullmatch("<0x[0-9A-F]{2}>", token) for token in vocab)
    if (model.get("byte_fallback")
        and not inert_fallback) or model.get("continuing_subword_prefix") or \
            model.get("end_of_word_suffix"):
        raise RunError(f"{where}: a SentencePiece-style BPE (byte_fallback, "
                       "continuing_subword_prefix or end_of_word_suffix set, as Llama-2's, "
                       f"Mistral's or TinyLlama's); {NOT_BYTE_LEVEL}")
    if model.get("dropout"):
        raise RunError(f"{where}: BPE dropout {model['dropout']} makes tokenization random")
    return model


def vocab_merges_directory(model_dir, config, special_map):
    """The Tokenizer of a directory with vocab.json + merges.txt and no tokenizer.json (a "slow"
    tokenizer), whose tokenizer_class gives the regex and the normaliser."""
    where = os.path.join(model_dir, VOCAB_JSON)
    class_name = config.get("tokenizer_class")
    class_key = tokenizer_class_key(class_name)
    if class_key not in (None, "GPT2Tokenizer", "Qwen2Tokenizer"):
        raise RunError(f"{model_dir}: vocab.json + merges.txt of tokenizer_class {class_name!r}, "
                       "whose pre-tokenization is not recorded in these files; supported without a "
                       "tokenizer.json: GPT2Tokenizer (the default), Qwen2Tokenizer")
    cls = TOKENIZER_CLASSES[class_key or "GPT2Tokenizer"]
    bos_token, eos_token = declared_tokens(model_dir, config, special_map, cls)
    if config.get("add_prefix_space"):
        raise RunError(f"{model_dir}: add_prefix_space=true (a space is put before every text) is "
                       "not supported")
    vocab = read_json(where)
    with open(os.path.join(model_dir, MERGES_TXT), encoding="utf-8") as f:
        merges = [line.rstrip("\n") for line in f if line.strip()
                  and not line.startswith("#version")]
    added = vocab_merges_added_tokens(model_dir, config, special_map, vocab, bos_token, eos_token)
    special_tokens = {t["content"]: t["id"] for t in added}
    ranks = byte_level_bpe_ranks(vocab, merges, special_tokens, where)
    require_every_byte(ranks, where, "without a tokenizer.json that says what its BPE does with "
                                     "them, the ids depend on the transformers version (slow "
                                     "tokenizers put unk_token there, fast ones drop them)")
    inline, inline_normalized = inline_tokens(added, cls["nfc"], where)
    prefix, suffix = added_around(config, bos_token, eos_token)
    return make_tokenizer(model_dir, ranks, special_tokens, dict(
        pattern=cls["pattern"], nfc=cls["nfc"], inline=inline, inline_normalized=inline_normalized,
        bos_token=bos_token, eos_token=eos_token, prefix=prefix, suffix=suffix))


def vocab_merges_added_tokens(model_dir, config, special_map, vocab, bos_token, eos_token):
    """The added tokens of a vocab.json + merges.txt directory, as tokenizer.json's added_tokens
    lists them: tokenizer_config.json's added_tokens_decoder, else added_tokens.json (legacy), and
    the named special tokens that are in vocab.json."""
    # the named special tokens in vocab.json are special tokens too: transformers registers them so
    named = [token_content(v) for f in (config, special_map) for k, v in f.items()
             if k in ("bos_token", "eos_token", "unk_token", "pad_token")] + [bos_token, eos_token]
    added = [dict(t, id=int(i)) for i, t in config.get("added_tokens_decoder", {}).items()]
    legacy = os.path.join(model_dir, ADDED_TOKENS_JSON)
    if not added and os.path.isfile(legacy):
        added = [dict(content=t, id=i, special=t in named, normalized=t not in named)
                 for t, i in read_json(legacy).items()]
    contents = {t["content"] for t in added}
    return added + [dict(content=t, id=vocab[t], special=True) for t in dict.fromkeys(named)
                    if t is not None and t in vocab and t not in contents]


def unk_convention(model, ranks, where):
    """Tokenizer's unk for a tokenizer.json BPE model: None when the vocabulary has every byte (unk
    never fires) or declares no unk_token (a byte it lacks is dropped: Tokenizer.encode_lossy), else
    (unk_token, its id, fuse_unk) (Tokenizer.encode_unk). Its id is the model vocabulary's, as
    BPE::merge_word looks it up; an unk_token outside it, or one that a merge joins to a neighbour,
    is refused."""
    unk_token, missing = model.get("unk_token"), missing_bytes(ranks)
    if unk_token is None or not missing:
        return None
    vocab = model.get("vocab") or {}
    if unk_token not in vocab:
        raise RunError(f"{where}: unk_token {unk_token!r} is not in the BPE vocabulary, so the "
                       f"`tokenizers` library fails on text holding one of the {len(missing)} "
                       "single bytes the vocabulary lacks; add it to the vocabulary or remove "
                       "unk_token")
    merged = [merge for merge in model.get("merges") or []
              if unk_token in (merge.split(" ") if isinstance(merge, str) else merge)]
    if merged:
        raise RunError(f"{where}: unk_token {unk_token!r} takes part in merge {merged[0]!r}, so an "
                       "unk merges with its neighbours; tiktoken cannot reproduce this tokenizer "
                       "exactly")
    return unk_token, vocab[unk_token], bool(model.get("fuse_unk", False))


def around(prefix, suffix):
    """'<s> before', '</s> after', both, or 'nothing': the special tokens put around a text, in
    words."""
    words = ([f"{' '.join(prefix)} before"] * bool(prefix)
             + [f"{' '.join(suffix)} after"] * bool(suffix))
    return " and ".join(words) or "nothing"


def steps(component, key):
    """The steps of a tokenizer.json component (normalizer, pre_tokenizer, post_processor): a
    Sequence's list under `key`, the component alone, or none."""
    return component.get(key, []) if component and component.get("type") == "Sequence" else \
        [component] if component else []


def normalizer_is_nfc(normalizer, where):
    """tokenizer.json "normalizer": none (False) or NFC (True), alone or as a one-item Sequence."""
    types = [n.get("type") for n in steps(normalizer, "normalizers")]
    if types not in ([], ["NFC"]):
        raise RunError(f"{where}: normalizer {' + '.join(map(str, types))} is not supported "
                       f"(supported: none, NFC); {NOT_BYTE_LEVEL}, without other normalisation")
    return types == ["NFC"]


def pre_tokenizer_pattern(pre_tokenizer, where):
    """tokenizer.json "pre_tokenizer" as one regex for tiktoken. Supported, as Hugging Face's
    tokenizers write them:
      ByteLevel(use_regex=true)                          GPT-2's regex (GPT2_PATTERN)
      Sequence[Split(Regex R, Isolated), ByteLevel(use_regex=false)]   R (Llama-3, Qwen2)
      Sequence[Digits, ByteLevel(use_regex=true)]        GPT-2's regex inside the digit-split
                                                         pieces (SmolLM)
    ByteLevel must not add a prefix space."""
    items = steps(pre_tokenizer, "pretokenizers")

    def describe(p):
        keys = {k: v for k, v in p.items()
                if k in ("use_regex", "individual_digits", "behavior", "invert")}
        if isinstance(p.get("pattern"), dict):
            keys["pattern"] = p["pattern"]
        return f"{p.get('type')}({', '.join(f'{k}={v!r}' for k, v in keys.items())})"

    found = " + ".join(map(describe, items)) or "none"
    for p in items:
        if p.get("type") == "ByteLevel" and p.get("add_prefix_space"):
            raise RunError(f"{where}: pre-tokenizer {found}: add_prefix_space=true (a space is put "
                           "before every text) is not supported")
    types = [p.get("type") for p in items]
    use_regex = items[-1].get("use_regex", True) if types and types[-1] == "ByteLevel" else None
    if types == ["ByteLevel"] and use_regex:
        return GPT2_PATTERN
    if types == ["Split", "ByteLevel"] and not use_regex:
        split = items[0]
        regex = split.get("pattern", {}).get("Regex")
        if regex is not None and split.get("behavior") == "Isolated" and not split.get("invert"):
            return regex
    if types == ["Digits", "ByteLevel"] and use_regex:
        return GPT2_DIGITS_PATTERN if items[0].get("individual_digits") else GPT2_DIGIT_RUNS_PATTERN
    raise RunError(f"{where}: pre-tokenizer {found} is not supported; supported: "
                   "ByteLevel(use_regex=True) (GPT-2), Split(Regex, Isolated) + "
                   "ByteLevel(use_regex=False) (Llama-3, Qwen2), Digits + "
                   "ByteLevel(use_regex=True) (SmolLM)")


def template_tokens(post_processor, special_tokens, where):
    """([names], [names]): the special tokens tokenizer.json's post-processor puts before and after
    a single text (its TemplateProcessing "single" template; ByteLevel post-processors only fix
    offsets)."""
    prefix, suffix, templates = [], [], 0
    for p in steps(post_processor, "processors"):
        if p.get("type") == "ByteLevel":
            continue
        templates += 1
        if p.get("type") != "TemplateProcessing" or templates > 1:
            raise RunError(f"{where}: post-processor {p.get('type')} is not supported (supported: "
                           "ByteLevel, one TemplateProcessing)")
        seen_text = False
        for item in p.get("single", []):
            if "Sequence" in item:  # $A, the text itself
                if item["Sequence"].get("id") != "A" or seen_text:
                    raise RunError(f"{where}: post-processor template {p['single']} is not "
                                   "'[token] $A [token]'")
                seen_text = True
                continue
            spec = p.get("special_tokens", {}).get(item.get("SpecialToken", {}).get("id"), {})
            tokens, ids = spec.get("tokens", []), spec.get("ids", [])
            if len(tokens) != 1 or len(ids) != 1 or special_tokens.get(tokens[0]) != ids[0]:
                raise RunError(f"{where}: post-processor token {item} is not one added token with "
                               "its id")
            (suffix if seen_text else prefix).append(tokens[0])
        if len(prefix) > 1 or len(suffix) > 1:
            raise RunError(f"{where}: the post-processor puts {prefix} before and {suffix} after a "
                           "text; at most one token on each side is supported")
    return prefix, suffix


def inline_tokens(added, nfc, where):
    """(all, normalized): the added tokens that are not special, which Hugging Face matches inside
    ordinary text; those with normalized=true are matched after normalisation. lstrip / rstrip /
    single_word change where they match: refused."""
    inline = [t for t in added if not t.get("special", False) and t["content"]]
    for t in inline:
        options = [key for key in ("lstrip", "rstrip", "single_word") if t.get(key)]
        if options:
            raise RunError(f"{where}: added token {t['content']!r} has {', '.join(options)}, which "
                           "is not supported")
    return [t["content"] for t in inline], [t["content"] for t in inline
                                            if t.get("normalized", True) and nfc]


def encode_document(enc, text):
    """Token ids of one document with its tokenizer's document boundaries (enc.doc_prefix /
    doc_suffix: what the tokenizer puts around a text, else EOS after). Special-token strings inside
    the text are encoded as ordinary text, so data cannot forge a boundary."""
    return encode_documents(enc, [text])[0]


def encode_documents(enc, texts):
    """encode_document of each text, the texts encoded in one call (enc.encode_ordinary_batch)."""
    before, after = enc.ids(enc.doc_prefix), enc.ids(enc.doc_suffix)
    return [before + ids + after for ids in enc.encode_ordinary_batch(texts)]


def describe_boundary(enc):
    """meta.json's "boundary": the document boundary convention used, and why, in words."""
    why = "as the tokenizer wraps every text" if enc.prefix or enc.suffix else \
        "the tokenizer puts nothing around a text, so its EOS ends each document"
    return f"{around(enc.doc_prefix, enc.doc_suffix)} each document ({why})"


def tokenizer_info(enc, spec):
    """What meta.json records about the tokenizer: enough to rebuild it (spec) and to check that a
    rebuilt or a different one is the same (sha256 over pattern, normalisation, specials and all
    ranks, and for family 'bpe' its conventions; FAMILIES' names stand for theirs, so their sha256
    is what it was before)."""
    described = [enc.name, enc._pat_str, enc.nfc, enc._special_tokens]
    if enc.name not in FAMILIES:
        described.append(conventions_of(enc))
    h = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    bos = enc.ids(enc.doc_prefix)[0] if enc.doc_prefix else None
    eos = enc.ids(enc.doc_suffix)[0] if enc.doc_suffix else None
    return dict(spec=spec if spec == "bytes" else os.path.abspath(spec), family=enc.name,
                pattern=enc._pat_str,
                nfc=enc.nfc, n_vocab=enc.n_vocab, special_tokens=enc._special_tokens, bos_id=bos,
                eos_id=eos,
                sha256=h.hexdigest(), boundary=describe_boundary(enc), bos_token=enc.bos_token,
                eos_token=enc.eos_token, prefix=list(enc.prefix), suffix=list(enc.suffix),
                inline=list(enc.inline),
                inline_normalized=list(enc.inline_normalized), missing_bytes=list(enc.missing),
                unk=list(enc.unk) if enc.unk else None)
