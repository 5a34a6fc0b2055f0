"""
Prepare training data once, before `torchrun train.py`: stream documents, tokenize them with the
teacher's tokenizer (through tiktoken) and write train/val shards of token ids.

    # offline CPU quick start: Python's own documentation, byte-level tokens
    python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes --val_every=10
    # the paper: 20B tokens of FineWeb-Edu with the teacher's (here Llama-3.2-3B's) tokenizer
    python prepare_data.py --source=fineweb-edu --fineweb_config=sample-100BT \
        --tokenizer=checkpoints/Llama-3.2-3B --out_dir=data/fineweb_edu_llama3 --max_tokens=20_000_000_000
    # any byte-level BPE tokenizer directory (SmolLM2, Qwen2.5, ...; config.json not needed)
    python prepare_data.py --source=docs/*.jsonl --tokenizer=checkpoints/SmolLM2-360M --out_dir=data/smollm2

Other scripts import the pieces they need (this module imports `datasets` only when it streams):
    from prepare_data import load_tokenizer, encode_document, read_shard
"""
import base64
import functools
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shlex
import struct
import sys
import time
import unicodedata
from collections import deque
from types import SimpleNamespace

import numpy as np
import tiktoken

from configurator import Key, parse

# -----------------------------------------------------------------------------
# Tokenizers, all as tiktoken Encodings
#
# A Hugging Face tokenizer is rebuilt from what its own files say, never from the model's name or type:
#   tokenizer.json             the BPE vocabulary and merges, the normalizer, the pre-tokenizer (turned into one
#                              regex), the added tokens, and the post-processor (the special tokens put around a text)
#   tokenizer_config.json,     bos_token and eos_token; add_bos_token / add_eos_token; tokenizer_class, whose
#   special_tokens_map.json    defaults transformers applies where these files say nothing
#   vocab.json + merges.txt    a "slow" tokenizer: the vocabulary; its tokenizer_class gives the regex
#   original/tokenizer.model   Meta's Llama-3 tiktoken file, with the conventions of Meta's tokenizer.py
# config.json is not read. tiktoken runs byte-level BPE only; anything else, and any setting these files hold
# that tiktoken cannot reproduce exactly, is refused with a message naming what was found.

# Pre-tokenization regexes: text is first split into pieces with these, then BPE runs inside each piece.
# GPT-2: the regex built into Hugging Face's ByteLevel pre-tokenizer (use_regex=true); also SmolLM's, GPT-NeoX's.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# GPT-2's regex applied inside the pieces of a Digits pre-tokenizer (SmolLM, StarCoder: Sequence[Digits,
# ByteLevel]). Digits cuts the text before and after every digit (individual_digits=true) or digit run, so
#   - a digit or run is a piece of its own: ' ?\p{N}+' becomes one digit (a run), without the leading space;
#   - a whitespace run just before a digit ends its piece, where '\s+(?!\S)' takes the whole run (as at the end
#     of a text): the lookahead becomes "not followed by a character that is neither a space nor a digit";
#   - every other alternative stops at a digit by itself, the punctuation class once digits are taken out of it.
# A "digit" is what Digits takes for one, Rust's char::is_numeric: \p{N} and 13 code points of Unicode 16 that
# the regex engines' older tables do not know yet (Kirat Rai U+11DE0-11DE9, U+16FF4-16FF6; DIGIT_EXTRA). Inside a
# run of digits GPT-2's regex still tells the two kinds apart (\p{N}+ and a "punctuation" run), so runs do too.
# tests/test_prepare_data.py checks these splits piece by piece against the `tokenizers` library.
DIGIT_EXTRA = r"\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6}"
GPT2_DIGITS_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|[\p{N}" + DIGIT_EXTRA + r"]| ?[^\s\p{L}\p{N}" + DIGIT_EXTRA
                       + r"]+|\s+(?![^\s\p{N}" + DIGIT_EXTRA + r"])|\s+")
GPT2_DIGIT_RUNS_PATTERN = GPT2_DIGITS_PATTERN.replace(r"|[\p{N}" + DIGIT_EXTRA + "]|",
                                                      r"|\p{N}+|[" + DIGIT_EXTRA + "]+|", 1)
# Llama 3: the cl100k-style pattern of Meta's tokenizer.py (also the Split regex in its tokenizer.json).
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen1.5 / Qwen2: the same, except that digits are split one at a time (\p{N} instead of \p{N}{1,3}).
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# The byte tokenizer has no merges, so every split gives the same ids; fixed-size pieces are the fastest.
BYTES_PATTERN = r"[\s\S]{1,256}"

# The three conventions this repo had before it read tokenizers' files (an Encoding whose conventions are exactly
# one of these keeps its name, so its meta.json sha256, and with it data and checkpoints made before, still match):
#   llama3: <|begin_of_text|> before each document (the HF Llama-3 tokenizer prepends it to every text)
#   qwen2:  <|endoftext|> after each document (Qwen has no BOS token; <|endoftext|> ends a document)
#   bytes:  <|endoftext|> after each document (the GPT-2 / nanoGPT convention)
# Every other tokenizer is family "bpe", and its conventions are part of its sha256.
FAMILIES = {
    "bytes": dict(pattern=BYTES_PATTERN, nfc=False, bos=None, eos="<|endoftext|>"),
    "llama3": dict(pattern=LLAMA3_PATTERN, nfc=False, bos="<|begin_of_text|>", eos=None),
    "qwen2": dict(pattern=QWEN2_PATTERN, nfc=True, bos=None, eos="<|endoftext|>"),
}

# What transformers assumes for a tokenizer_class where tokenizer_config.json / special_tokens_map.json say nothing
# (the defaults of the classes' __init__ in transformers; "...Fast" names the same class). pattern and nfc are used
# only for vocab.json + merges.txt: with a tokenizer.json the `tokenizers` library follows the file, and so do we.
# LlamaTokenizer rebuilds the post-processor from add_bos_token (default true) whatever tokenizer.json says.
TOKENIZER_CLASSES = {
    "GPT2Tokenizer": dict(pattern=GPT2_PATTERN, nfc=False, bos_token="<|endoftext|>", eos_token="<|endoftext|>"),
    "Qwen2Tokenizer": dict(pattern=QWEN2_PATTERN, nfc=True, bos_token=None, eos_token="<|endoftext|>"),
    "LlamaTokenizer": dict(bos_token="<s>", eos_token="</s>", add_bos_token=True, add_eos_token=False),
}  # any other class (PreTrainedTokenizerFast: Llama-3's) assumes nothing
NOT_BYTE_LEVEL = "only byte-level BPE tokenizers (GPT-2, Llama-3, Qwen, SmolLM style) can be represented in tiktoken"


class Tokenizer(tiktoken.Encoding):
    """A tiktoken Encoding plus what tiktoken does not model, as the tokenizer's files say:
      nfc             NFC-normalise text first (tokenizer.json "normalizer": NFC, as Qwen's)
      inline          added tokens that are not special: Hugging Face matches them inside ordinary text before
                      pre-tokenization (leftmost-longest; those with normalized=true after normalization), and so
                      does encode_ordinary here (Qwen2.5's <tool_call>, ...)
      prefix, suffix  the special tokens the tokenizer puts around a text (add_special_tokens=True): Llama-3's
                      <|begin_of_text|> before; nothing for GPT-2, Qwen, SmolLM
      bos_token, eos_token   the tokenizer's declared BOS and EOS
    Document boundaries follow from them: a document is wrapped as the tokenizer wraps a text; a tokenizer that
    adds nothing (GPT-2, Qwen, SmolLM) gets its EOS after each document.
    Special tokens are never matched in text: their strings are encoded as ordinary text, so data cannot forge a
    boundary (Hugging Face would match them: the one deliberate difference)."""

    def __init__(self, name, *, pat_str, mergeable_ranks, special_tokens, nfc=False, inline=(),
                 inline_normalized=(), bos_token=None, eos_token=None, prefix=(), suffix=()):
        super().__init__(name, pat_str=pat_str, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens)
        self.nfc, self.inline, self.inline_normalized = nfc, tuple(inline), tuple(inline_normalized)
        self.bos_token, self.eos_token, self.prefix, self.suffix = bos_token, eos_token, tuple(prefix), tuple(suffix)
        self.doc_prefix = self.prefix
        self.doc_suffix = self.suffix if self.prefix or self.suffix else (eos_token,) if eos_token else ()
        # lm-evaluation-harness's prefix token (the context of an empty-context request): BOS, else EOS
        self.prefix_token = bos_token if bos_token is not None else eos_token
        self._raw_inline = tuple(sorted(t for t in self.inline if t not in self.inline_normalized))
        self._normalized_inline = tuple(sorted(self.inline_normalized))

    def __getstate__(self):  # pickled whole (to the tokenizer workers), conventions included
        return dict(name=self.name, pat_str=self._pat_str, mergeable_ranks=self._mergeable_ranks,
                    special_tokens=self._special_tokens, nfc=self.nfc, inline=self.inline,
                    inline_normalized=self.inline_normalized, bos_token=self.bos_token, eos_token=self.eos_token,
                    prefix=self.prefix, suffix=self.suffix)

    def ids(self, names):
        return [self._special_tokens[name] for name in names]

    def encode_ordinary(self, text):
        return self._encode(text, self._raw_inline, self._normalized_inline)

    def encode(self, text, *, allowed_special=frozenset(), disallowed_special="all"):
        """tiktoken's encode (special-token strings raise unless allowed or disallowed_special=()), with this
        tokenizer's normalisation and inline tokens; allowed special tokens are matched like inline ones."""
        allowed = self.special_tokens_set if allowed_special == "all" else set(allowed_special)
        if disallowed_special == "all":
            disallowed_special = self.special_tokens_set - allowed - set(self.inline)
        if disallowed_special:
            match = split_regex(tuple(sorted(disallowed_special))).search(text)
            if match:
                raise ValueError(f"text contains the special token {match.group()!r}; pass allowed_special or "
                                 f"disallowed_special=() (or use encode_ordinary)")
        return self._encode(text, tuple(sorted(allowed | set(self._raw_inline))), self._normalized_inline)

    def encode_to_numpy(self, text, **kwargs):
        return np.array(self.encode(text, **kwargs), dtype=np.uint32)

    def _encode(self, text, raw, normalized):
        """Hugging Face's order: tokens matched in the raw text, then each piece between them normalised, then
        tokens matched in the normalised pieces, then pre-tokenization and BPE (tiktoken) of what is left."""
        ids = []
        for piece, token in split_on(text, raw):
            if token:
                ids.append(self._special_tokens[token])
                continue
            if self.nfc:
                piece = unicodedata.normalize("NFC", piece)
            for sub, token in split_on(piece, normalized):
                if token:
                    ids.append(self._special_tokens[token])
                elif sub:
                    ids += super().encode_ordinary(sub)
        return ids


@functools.lru_cache(maxsize=16)
def split_regex(tokens):
    """A regex matching any of `tokens`, the longest where several start at the same position (Python's re tries
    alternatives in order), so leftmost-longest like the Aho-Corasick matcher of Hugging Face's added tokens."""
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def split_on(text, tokens):
    """[(piece, None) or ('', token)] covering text, cut where one of `tokens` (a sorted tuple) occurs."""
    if not tokens:
        return [(text, None)]
    out, start = [], 0
    for match in split_regex(tokens).finditer(text):
        out += [(text[start:match.start()], None), ("", match.group())]
        start = match.end()
    return out + [(text[start:], None)]


def gpt2_unicode_to_byte():
    """Byte-level BPE vocabularies (GPT-2, Llama-3's tokenizer.json, Qwen) spell each byte as one printable
    character: bytes that are printable in Latin-1 stand for themselves, the other 68 are mapped in order
    to chr(256), chr(257), ... (GPT-2's bytes_to_unicode). This returns the inverse map, char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def read_tiktoken_file(path):
    """A tiktoken BPE file (Llama-3's original/tokenizer.model): one 'base64(token bytes) rank' per line.
    Parsed here rather than with tiktoken.load.load_tiktoken_bpe, which caches files by path in /tmp and
    would silently return stale ranks after a file at the same path changes."""
    ranks = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:  # also binascii.Error
                raise SystemExit(f"{path}:{line_no}: not a tiktoken BPE file (expected 'base64-token rank' lines; "
                                 f"SentencePiece models such as Llama-2's are not supported: {NOT_BYTE_LEVEL})")
    if not ranks:
        raise SystemExit(f"{path}: empty tokenizer file")
    return ranks


def llama3_special_tokens(n_ranks):
    """The 256 special tokens that Meta's Llama-3 tokenizer.py appends after the BPE ranks (128000-128255
    for the real vocabulary); used when a checkpoint has no tokenizer.json naming them."""
    names = (["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
             + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
             + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
    return {name: n_ranks + i for i, name in enumerate(names)}


def meta_llama3_conventions():
    """Meta's tokenizer.py: its regex, BOS <|begin_of_text|> before a text, EOS <|end_of_text|>, no normaliser."""
    return dict(pattern=LLAMA3_PATTERN, nfc=False, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                prefix=["<|begin_of_text|>"], suffix=[])


def byte_level_bpe_ranks(vocab, merges, special_tokens, where):
    """tiktoken ranks from a Hugging Face byte-level BPE (vocab: token string -> id, merges: 'a b' lines or
    [a, b] pairs); tokens in special_tokens are left out (they are tiktoken special tokens). The rank of a token is
    its id. tiktoken merges the adjacent pair whose merged token has the lowest rank, HF merges the pair listed
    first in merges; the two agree when ids grow with merge order, as in vocabularies built by BPE training (GPT-2,
    Llama-3, Qwen), so that is checked instead of silently tokenizing differently."""
    to_byte = gpt2_unicode_to_byte()
    special_ids = set(special_tokens.values())
    as_bytes = {}
    for token, i in vocab.items():
        if i in special_ids or token in special_tokens:
            continue
        try:
            as_bytes[token] = bytes(to_byte[c] for c in token)
        except KeyError:
            raise SystemExit(f"{where}: token {token!r} is not byte-level BPE; {NOT_BYTE_LEVEL}") from None
    ranks = {as_bytes[token]: i for token, i in vocab.items() if token in as_bytes}
    if len(ranks) != len(as_bytes) or len(set(ranks.values())) != len(ranks):
        raise SystemExit(f"{where}: two tokens share a byte string or an id; not a BPE vocabulary tiktoken can hold")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise SystemExit(f"{where}: the vocabulary lacks {len(missing)} of the 256 single bytes (e.g. byte "
                         f"{missing[0]}); byte-level BPE needs all of them")
    last = -1
    for merge in merges:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        if left not in as_bytes or right not in as_bytes or left + right not in as_bytes:
            raise SystemExit(f"{where}: merge {left!r} + {right!r} names a token that is not in the vocabulary")
        rank = vocab[left + right]
        if rank < last:
            raise SystemExit(f"{where}: merge {left!r} + {right!r} is out of id order; tiktoken cannot reproduce "
                             f"this tokenizer exactly")
        last = rank
    return ranks


def load_tokenizer(spec):
    """A Tokenizer (a tiktoken.Encoding) for --tokenizer=spec:
    'bytes'          256 byte tokens + <|endoftext|> = 256; needs no file.
    a file           a tiktoken BPE file (Meta's Llama-3 original/tokenizer.model), with Meta's conventions.
    a directory      a Hugging Face model or tokenizer directory (config.json optional): tokenizer.json, else
                     vocab.json + merges.txt, else original/tokenizer.model (see the top of this section).
    Its name is its family: one of FAMILIES when its conventions are exactly that one's, else 'bpe'."""
    if spec == "bytes":
        return make_tokenizer(spec, {bytes([b]): b for b in range(256)}, {"<|endoftext|>": 256},
                              dict(pattern=BYTES_PATTERN, nfc=False, bos_token=None, eos_token="<|endoftext|>"))
    if os.path.isfile(spec):
        ranks = read_tiktoken_file(spec)
        return make_tokenizer(spec, ranks, llama3_special_tokens(len(ranks)), meta_llama3_conventions())
    if os.path.isdir(spec):
        return load_tokenizer_directory(spec)
    raise SystemExit(f"--tokenizer={spec!r}: unknown tokenizer; expected 'bytes', a tiktoken BPE file, or a "
                     f"Hugging Face model or tokenizer directory")


def conventions_of(enc):
    """Everything besides the vocabulary and the special tokens that decides the ids this repo writes (shards) and
    scores (eval_zeroshot.py): what sha256 covers for family 'bpe', and what FAMILIES' names stand for."""
    return dict(pattern=enc._pat_str, nfc=enc.nfc, inline=sorted(enc.inline),
                inline_normalized=sorted(enc.inline_normalized), prefix=list(enc.prefix), suffix=list(enc.suffix),
                document=[list(enc.doc_prefix), list(enc.doc_suffix)], prefix_token=enc.prefix_token)


def family_conventions(family):
    f = FAMILIES[family]
    return dict(pattern=f["pattern"], nfc=f["nfc"], inline=[], inline_normalized=[],
                prefix=[f["bos"]] if f["bos"] else [], suffix=[],
                document=[[f["bos"]] if f["bos"] else [], [f["eos"]] if f["eos"] else []],
                prefix_token=f["bos"] or f["eos"])


def make_tokenizer(where, ranks, special_tokens, conv):
    """The Tokenizer, after checking that every special token its conventions use is one of its tokens."""
    conv = dict(conv)
    pattern = conv.pop("pattern")
    try:
        enc = Tokenizer("bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_tokens, **conv)
    except ValueError as e:  # tiktoken's regex engine cannot compile the pattern
        raise SystemExit(f"{where}: pre-tokenizer regex {pattern!r} is not supported by tiktoken: {e}") from None
    # the tokens it uses: around texts and documents, and lm-evaluation-harness's prefix token (BOS, else EOS)
    roles = [("the token put before a text", t) for t in enc.prefix] + [("the token put after a text", t)
                                                                          for t in enc.suffix]
    roles += [("eos_token", enc.eos_token)] if enc.eos_token in enc.doc_suffix or enc.bos_token is None else []
    roles += [("bos_token", enc.bos_token)]
    listed = ", ".join(list(special_tokens)[:5]) + (", ..." if len(special_tokens) > 5 else "") or "none"
    for role, name in roles:
        if name is not None and name not in special_tokens:
            raise SystemExit(f"{where}: {role} {name!r} is not one of its special tokens ({len(special_tokens)}: "
                             f"{listed})")
    if not enc.doc_prefix and not enc.doc_suffix:
        raise SystemExit(f"{where}: puts no special token around a text and names no eos_token, so documents cannot "
                         f"be separated; name one in tokenizer_config.json (\"eos_token\")")
    conventions = conventions_of(enc)
    enc.name = next((name for name in FAMILIES if family_conventions(name) == conventions), "bpe")
    return enc


def token_content(value):
    """A token as tokenizer_config.json / special_tokens_map.json write it: a string, an AddedToken dict, or null."""
    return value.get("content") if isinstance(value, dict) else value


def load_tokenizer_directory(model_dir):
    """The Tokenizer of a Hugging Face directory, from its own files (see the top of this section)."""
    def path(*names):
        return os.path.join(model_dir, *names)

    def read_json(*names):
        try:
            with open(path(*names), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path(*names)}: cannot read: {e}") from None

    config = read_json("tokenizer_config.json") if os.path.isfile(path("tokenizer_config.json")) else {}
    special_map = read_json("special_tokens_map.json") if os.path.isfile(path("special_tokens_map.json")) else {}
    class_name = config.get("tokenizer_class")
    class_key = class_name.removesuffix("Fast") if class_name else None

    def declared(key, defaults):
        """bos_token / eos_token: tokenizer_config.json, special_tokens_map.json (they must agree), else what
        transformers' tokenizer_class assumes (defaults)."""
        found = {token_content(f[key]) for f in (config, special_map) if key in f}
        if len(found) > 1:
            raise SystemExit(f"{model_dir}: tokenizer_config.json and special_tokens_map.json name different "
                             f"{key}s: {sorted(found, key=str)}")
        return found.pop() if found else defaults.get(key)

    tiktoken_file = path("original", "tokenizer.model")
    if os.path.isfile(path("tokenizer.json")):
        tokenizer_json = read_json("tokenizer.json")
        where = path("tokenizer.json")
        class_defaults = TOKENIZER_CLASSES.get(class_key, {})
        bos_token, eos_token = declared("bos_token", class_defaults), declared("eos_token", class_defaults)
        model = tokenizer_json.get("model") or {}
        model_type = model.get("type", "BPE" if "merges" in model else None)
        if model_type != "BPE":
            raise SystemExit(f"{where}: a {model_type} model; {NOT_BYTE_LEVEL}")
        if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            raise SystemExit(f"{where}: a SentencePiece-style BPE (byte_fallback, continuing_subword_prefix or "
                             f"end_of_word_suffix set, as Llama-2's, Mistral's or TinyLlama's); {NOT_BYTE_LEVEL}")
        if model.get("dropout"):
            raise SystemExit(f"{where}: BPE dropout {model['dropout']} makes tokenization random")
        added = tokenizer_json.get("added_tokens") or []
        special_tokens = {t["content"]: t["id"] for t in added}
        nfc = normalizer_is_nfc(tokenizer_json.get("normalizer"), where)
        pattern = pre_tokenizer_pattern(tokenizer_json.get("pre_tokenizer"), where)
        ranks = byte_level_bpe_ranks(model.get("vocab") or {}, model.get("merges") or [], special_tokens, where)
        if os.path.isfile(tiktoken_file) and read_tiktoken_file(tiktoken_file) != ranks:
            raise SystemExit(f"{model_dir}: original/tokenizer.model and tokenizer.json hold different vocabularies")
        prefix, suffix = template_tokens(tokenizer_json.get("post_processor"), special_tokens, where)
        # transformers rebuilds the template from add_bos_token / add_eos_token when tokenizer_config.json sets them
        # (and LlamaTokenizer always); the `tokenizers` library and older transformers keep tokenizer.json's.
        # When the two disagree, whether a text starts with BOS depends on the version: refused.
        flags = {key: config.get(key, class_defaults.get(key)) for key in ("add_bos_token", "add_eos_token")
                 if key in config or key in class_defaults}
        if flags:
            wanted = ([bos_token] if flags.get("add_bos_token") and bos_token else [],
                      [eos_token] if flags.get("add_eos_token") and eos_token else [])
            if wanted != (prefix, suffix):
                raise SystemExit(f"{model_dir}: tokenizer_config.json ({class_name or 'no tokenizer_class'}, "
                                 f"{', '.join(f'{k}={v}' for k, v in flags.items())}) puts {around(*wanted)} around "
                                 f"a text, tokenizer.json's post-processor {around(prefix, suffix)}; transformers "
                                 f"versions differ in which applies, so make them agree")
        inline, inline_normalized = inline_tokens(added, nfc, where)
        return make_tokenizer(model_dir, ranks, special_tokens, dict(
            pattern=pattern, nfc=nfc, inline=inline, inline_normalized=inline_normalized, bos_token=bos_token,
            eos_token=eos_token, prefix=prefix, suffix=suffix))

    if os.path.isfile(tiktoken_file):  # Meta's layout without tokenizer.json: Meta's conventions
        decoder = config.get("added_tokens_decoder", {})
        ranks = read_tiktoken_file(tiktoken_file)
        special_tokens = {t["content"]: int(i) for i, t in decoder.items()} or llama3_special_tokens(len(ranks))
        return make_tokenizer(model_dir, ranks, special_tokens, meta_llama3_conventions())

    if os.path.isfile(path("vocab.json")) and os.path.isfile(path("merges.txt")):
        where = path("vocab.json")
        if class_key not in (None, "GPT2Tokenizer", "Qwen2Tokenizer"):
            raise SystemExit(f"{model_dir}: vocab.json + merges.txt of tokenizer_class {class_name!r}, whose "
                             f"pre-tokenization is not recorded in these files; supported without a tokenizer.json: "
                             f"GPT2Tokenizer (the default), Qwen2Tokenizer")
        cls = TOKENIZER_CLASSES[class_key or "GPT2Tokenizer"]
        bos_token, eos_token = declared("bos_token", cls), declared("eos_token", cls)
        if config.get("add_prefix_space"):
            raise SystemExit(f"{model_dir}: add_prefix_space=true (a space is put before every text) is not supported")
        vocab = read_json("vocab.json")
        with open(path("merges.txt"), encoding="utf-8") as f:
            merges = [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#version")]
        # the added tokens: tokenizer_config.json's added_tokens_decoder, else added_tokens.json (legacy); the named
        # special tokens that are in vocab.json are special tokens too (transformers registers them so)
        named = [token_content(v) for f in (config, special_map) for k, v in f.items()
                 if k in ("bos_token", "eos_token", "unk_token", "pad_token")] + [bos_token, eos_token]
        added = [dict(t, id=int(i)) for i, t in config.get("added_tokens_decoder", {}).items()]
        if not added and os.path.isfile(path("added_tokens.json")):
            added = [dict(content=t, id=i, special=t in named, normalized=t not in named)
                     for t, i in read_json("added_tokens.json").items()]
        contents = {t["content"] for t in added}
        added += [dict(content=t, id=vocab[t], special=True) for t in dict.fromkeys(named)
                  if t is not None and t in vocab and t not in contents]
        special_tokens = {t["content"]: t["id"] for t in added}
        ranks = byte_level_bpe_ranks(vocab, merges, special_tokens, where)
        inline, inline_normalized = inline_tokens(added, cls["nfc"], where)
        return make_tokenizer(model_dir, ranks, special_tokens, dict(
            pattern=cls["pattern"], nfc=cls["nfc"], inline=inline, inline_normalized=inline_normalized,
            bos_token=bos_token, eos_token=eos_token,  # (transformers ignores add_*_token without such a token)
            prefix=[bos_token] if config.get("add_bos_token") and bos_token else [],
            suffix=[eos_token] if config.get("add_eos_token") and eos_token else []))

    found = [name for name in ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "tekken.json",
                               "vocab.txt", "tiktoken.model") if os.path.isfile(path(name))]
    if found:
        raise SystemExit(f"--tokenizer={model_dir}: has {', '.join(found)} but no tokenizer.json or vocab.json + "
                         f"merges.txt (SentencePiece, WordPiece or another format); {NOT_BYTE_LEVEL}")
    raise SystemExit(f"--tokenizer={model_dir}: has no tokenizer.json, vocab.json + merges.txt, or "
                     f"original/tokenizer.model")


def around(prefix, suffix):
    """'<s> before', '</s> after', both, or 'nothing': the special tokens put around a text, in words."""
    words = [f"{' '.join(prefix)} before"] * bool(prefix) + [f"{' '.join(suffix)} after"] * bool(suffix)
    return " and ".join(words) or "nothing"


def normalizer_is_nfc(normalizer, where):
    """tokenizer.json "normalizer": none (False) or NFC (True), alone or as a one-item Sequence."""
    items = normalizer.get("normalizers", []) if normalizer and normalizer.get("type") == "Sequence" else \
        [normalizer] if normalizer else []
    types = [n.get("type") for n in items]
    if types not in ([], ["NFC"]):
        raise SystemExit(f"{where}: normalizer {' + '.join(map(str, types))} is not supported (supported: none, "
                         f"NFC); {NOT_BYTE_LEVEL}, without other normalisation")
    return types == ["NFC"]


def pre_tokenizer_pattern(pre_tokenizer, where):
    """tokenizer.json "pre_tokenizer" as one regex for tiktoken. Supported, as Hugging Face's tokenizers write them:
      ByteLevel(use_regex=true)                             GPT-2's regex (GPT2_PATTERN)
      Sequence[Split(Regex R, Isolated), ByteLevel(use_regex=false)]   R (Llama-3, Qwen2)
      Sequence[Digits, ByteLevel(use_regex=true)]           GPT-2's regex inside the digit-split pieces (SmolLM)
    ByteLevel must not add a prefix space."""
    items = pre_tokenizer.get("pretokenizers", []) if pre_tokenizer and pre_tokenizer.get("type") == "Sequence" \
        else [pre_tokenizer] if pre_tokenizer else []

    def describe(p):
        keys = {k: v for k, v in p.items() if k in ("use_regex", "individual_digits", "behavior", "invert")}
        if isinstance(p.get("pattern"), dict):
            keys["pattern"] = p["pattern"]
        return f"{p.get('type')}({', '.join(f'{k}={v!r}' for k, v in keys.items())})"

    found = " + ".join(map(describe, items)) or "none"
    for p in items:
        if p.get("type") == "ByteLevel" and p.get("add_prefix_space"):
            raise SystemExit(f"{where}: pre-tokenizer {found}: add_prefix_space=true (a space is put before every "
                             f"text) is not supported")
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
    raise SystemExit(f"{where}: pre-tokenizer {found} is not supported; supported: ByteLevel(use_regex=True) "
                     f"(GPT-2), Split(Regex, Isolated) + ByteLevel(use_regex=False) (Llama-3, Qwen2), Digits + "
                     f"ByteLevel(use_regex=True) (SmolLM)")


def template_tokens(post_processor, special_tokens, where):
    """([names], [names]): the special tokens tokenizer.json's post-processor puts before and after a single text
    (its TemplateProcessing "single" template; ByteLevel post-processors only fix offsets)."""
    items = post_processor.get("processors", []) if post_processor and post_processor.get("type") == "Sequence" \
        else [post_processor] if post_processor else []
    prefix, suffix, templates = [], [], 0
    for p in items:
        if p.get("type") == "ByteLevel":
            continue
        templates += 1
        if p.get("type") != "TemplateProcessing" or templates > 1:
            raise SystemExit(f"{where}: post-processor {p.get('type')} is not supported (supported: ByteLevel, "
                             f"one TemplateProcessing)")
        seen_text = False
        for item in p.get("single", []):
            if "Sequence" in item:  # $A, the text itself
                if item["Sequence"].get("id") != "A" or seen_text:
                    raise SystemExit(f"{where}: post-processor template {p['single']} is not '[token] $A [token]'")
                seen_text = True
                continue
            spec = p.get("special_tokens", {}).get(item.get("SpecialToken", {}).get("id"), {})
            tokens, ids = spec.get("tokens", []), spec.get("ids", [])
            if len(tokens) != 1 or len(ids) != 1 or special_tokens.get(tokens[0]) != ids[0]:
                raise SystemExit(f"{where}: post-processor token {item} is not one added token with its id")
            (suffix if seen_text else prefix).append(tokens[0])
        if len(prefix) > 1 or len(suffix) > 1:
            raise SystemExit(f"{where}: the post-processor puts {prefix} before and {suffix} after a text; at most "
                             f"one token on each side is supported")
    return prefix, suffix


def inline_tokens(added, nfc, where):
    """(all, normalized): the added tokens that are not special, which Hugging Face matches inside ordinary text;
    those with normalized=true are matched after normalisation. lstrip / rstrip / single_word change where they
    match: refused."""
    inline = [t for t in added if not t.get("special", False) and t["content"]]
    for t in inline:
        options = [key for key in ("lstrip", "rstrip", "single_word") if t.get(key)]
        if options:
            raise SystemExit(f"{where}: added token {t['content']!r} has {', '.join(options)}, which is not supported")
    return [t["content"] for t in inline], [t["content"] for t in inline if t.get("normalized", True) and nfc]


def encode_document(enc, text):
    """Token ids of one document with its tokenizer's document boundaries (enc.doc_prefix / doc_suffix: what the
    tokenizer puts around a text, else EOS after). Special-token strings inside the text are encoded as ordinary
    text, so data cannot forge a boundary."""
    return enc.ids(enc.doc_prefix) + enc.encode_ordinary(text) + enc.ids(enc.doc_suffix)


def describe_boundary(enc):
    """meta.json's "boundary": the document boundary convention used, and why, in words."""
    why = "as the tokenizer wraps every text" if enc.prefix or enc.suffix else \
        "the tokenizer puts nothing around a text, so its EOS ends each document"
    return f"{around(enc.doc_prefix, enc.doc_suffix)} each document ({why})"


def tokenizer_info(enc, spec):
    """What meta.json records about the tokenizer: enough to rebuild it (spec) and to check that a rebuilt
    or a different one is the same (sha256 over pattern, normalisation, specials and all ranks, and for family
    'bpe' its conventions; FAMILIES' names stand for theirs, so their sha256 is what it was before)."""
    described = [enc.name, enc._pat_str, enc.nfc, enc._special_tokens]
    if enc.name not in FAMILIES:
        described.append(conventions_of(enc))
    h = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    bos = enc.ids(enc.doc_prefix)[0] if enc.doc_prefix else None
    eos = enc.ids(enc.doc_suffix)[0] if enc.doc_suffix else None
    return dict(spec=spec if spec == "bytes" else os.path.abspath(spec), family=enc.name, pattern=enc._pat_str,
                nfc=enc.nfc, n_vocab=enc.n_vocab, special_tokens=enc._special_tokens, bos_id=bos, eos_id=eos,
                sha256=h.hexdigest(), boundary=describe_boundary(enc), bos_token=enc.bos_token,
                eos_token=enc.eos_token, prefix=list(enc.prefix), suffix=list(enc.suffix), inline=list(enc.inline),
                inline_normalized=list(enc.inline_normalized))

# -----------------------------------------------------------------------------
# Shards: a 24-byte little-endian header, then the token ids (uint16 or uint32, little-endian).
#   magic 8 bytes b"ASASHARD" | version uint32 | bytes per token uint32 (2 or 4) | token count uint64
# The count and the file size together reveal a truncated file; the magic a file of some other kind.

MAGIC, VERSION = b"ASASHARD", 1
HEADER = struct.Struct("<8sIIQ")


def write_shard(path, arrays, dtype):
    """Write the concatenation of `arrays` as one shard, atomically: a crash leaves at most a *.tmp file."""
    dtype = np.dtype(dtype).newbyteorder("<")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, dtype.itemsize, sum(len(a) for a in arrays)))
        for a in arrays:
            f.write(np.asarray(a, dtype=dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_shard(path):
    """The token ids of a shard as a read-only memory-mapped numpy array (the header is validated first)."""
    with open(path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size or header[:8] != MAGIC:
        raise SystemExit(f"{path}: not a token shard written by prepare_data.py (bad magic)")
    _, version, itemsize, count = HEADER.unpack(header)
    if version != VERSION or itemsize not in (2, 4):
        raise SystemExit(f"{path}: unsupported shard version {version} / {itemsize} bytes per token")
    expected, actual = HEADER.size + count * itemsize, os.path.getsize(path)
    if actual != expected:
        raise SystemExit(f"{path}: truncated or corrupt: the header promises {count} tokens ({expected} bytes), "
                         f"the file has {actual} bytes; re-run prepare_data.py")
    return np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=HEADER.size, shape=(count,))

def read_meta(data_dir):
    """meta.json of a prepare_data.py output directory (what train.py and distill.py read first)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isdir(data_dir):
        raise SystemExit(f"data_dir={data_dir}: no such directory; run prepare_data.py first")
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no such file; data_dir must be an output directory of prepare_data.py")
    with open(path) as f:
        return json.load(f)


class Windows:
    """A split cut into windows of block_size + 1 tokens (inputs and their next-token targets; consecutive
    windows share one token), for training (train.py) and evaluation (distill.py). NumPy only, so that
    importing this module stays cheap for the tokenizer workers."""

    def __init__(self, data_dir, split, block_size):
        names = read_meta(data_dir)["splits"][split]["shards"]
        self.shards = [read_shard(os.path.join(data_dir, name)) for name in names]
        self.block_size = block_size
        self.starts = np.cumsum([0] + [(len(s) - 1) // block_size for s in self.shards])  # first window of each shard
        if self.starts[-1] == 0:
            raise SystemExit(f"{data_dir}: the {split} split has fewer than block_size + 1 = {block_size + 1} tokens")
        self.perm_key, self.perm = None, None  # the permutation of the current (seed, epoch)

    def __len__(self):
        return int(self.starts[-1])

    def get(self, indices):
        """(x, y): int64 arrays (len(indices), block_size), the windows at these indices and their targets."""
        rows = []
        for i in indices:
            shard = int(np.searchsorted(self.starts, i, side="right")) - 1
            offset = (int(i) - int(self.starts[shard])) * self.block_size
            rows.append(self.shards[shard][offset:offset + self.block_size + 1])
        batch = np.stack(rows).astype(np.int64)
        return batch[:, :-1], batch[:, 1:]

    def step_indices(self, seed, step, global_batch_size):
        """The window indices of optimizer step `step`: positions step*G ... (step+1)*G - 1 of the stream of
        epochs, each epoch a permutation of all windows seeded by (seed, epoch)."""
        out = []
        for position in range(step * global_batch_size, (step + 1) * global_batch_size):
            epoch, k = divmod(position, len(self))
            if (seed, epoch) != self.perm_key:
                self.perm = np.random.default_rng([seed, epoch]).permutation(len(self))
                self.perm_key = (seed, epoch)
            out.append(int(self.perm[k]))
        return out


# -----------------------------------------------------------------------------
# Sources: every source is a `datasets` IterableDataset, so reading is streamed (memory does not grow with
# the dataset) and its state_dict() lets an interrupted run resume without re-reading finished data.

BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def builtin_corpus():
    """The offline corpus: the Python Language Reference help topics that ship with every Python
    (pydoc_data.topics, what help('assert') shows; ~0.5 MB of English prose and code), one document per topic."""
    from pydoc_data.topics import topics
    return [topics[name] for name in sorted(topics)]


def resolve_files(source):
    """The files named by a comma-separated list of paths and globs, in the order given (globs sorted)."""
    files = []
    for pattern in source.split(","):
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise SystemExit(f"--source: {pattern!r} matches no file")
        for f in matches:
            if not os.path.isfile(f) or os.path.splitext(f)[1] not in BUILDERS:
                raise SystemExit(f"--source: {f!r} is not a file with a supported extension ({', '.join(BUILDERS)})")
            files.append(os.path.abspath(f))
    if len({BUILDERS[os.path.splitext(f)[1]] for f in files}) > 1:
        raise SystemExit("--source: mixes file types; run prepare_data.py once per type")
    return files


def open_source(source_info):
    """The document stream as (IterableDataset, name of its text column)."""
    import datasets  # slow to import, so only here
    source = source_info["source"]
    if source == "fineweb-edu":
        try:
            ds = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name=source_info["fineweb_config"],
                                       split="train", streaming=True)
        except (OSError, ValueError) as e:  # offline, or no such config
            raise SystemExit(f"--source=fineweb-edu: cannot open HuggingFaceFW/fineweb-edu "
                             f"({source_info['fineweb_config']}): {e}")
        return ds, source_info["text_field"]
    if source == "builtin":
        return datasets.Dataset.from_dict({"text": builtin_corpus()}).to_iterable_dataset(), "text"
    files = source_info["files"]
    builder = BUILDERS[os.path.splitext(files[0])[1]]
    if builder == "text":  # the text builder always names its column "text"
        ds = datasets.load_dataset("text", data_files=files, split="train", streaming=True,
                                   sample_by=source_info["txt_sample_by"])
        return ds, "text"
    return datasets.load_dataset(builder, data_files=files, split="train", streaming=True), source_info["text_field"]


CHUNK_CHARS = 1 << 20  # documents are tokenized in chunks of about 1M characters (one task for a worker)


def document_chunks(ds, text_field, first_index, val_every):
    """Group the stream into chunks of whole documents, in stream order. Chunk boundaries depend only on the
    data, so the output does not depend on --num_proc. Document i (counting non-empty documents from 0) is
    held out for validation when i % val_every == 0. Yields (docs, (documents read so far, stream state))."""
    docs, n_chars, index = [], 0, first_index
    try:
        for row in ds:
            text = row.get(text_field)
            if not isinstance(text, str):
                raise SystemExit(f"--text_field={text_field!r}: document {index} has no such text field "
                                 f"(fields: {', '.join(row)})")
            if text:
                docs.append((index % val_every == 0, text))
                index += 1
                n_chars += len(text)
            if n_chars >= CHUNK_CHARS:
                yield docs, (index, ds.state_dict())
                docs, n_chars = [], 0
    except ValueError as e:  # unreadable input: bad JSON, not UTF-8, columns that differ between files, ...
        raise SystemExit(f"--source: cannot read the input: {e}") from e
    if docs:
        yield docs, (index, ds.state_dict())

# -----------------------------------------------------------------------------
# Parallel tokenization

worker_enc, worker_dtype = None, None  # set by init_worker in each worker (in this process for --num_proc=1)


def init_worker(enc, dtype):
    global worker_enc, worker_dtype
    worker_enc, worker_dtype = enc, dtype


def tokenize_chunk(docs):
    """-> (train token ids, train document lengths, val token ids, number of val documents)"""
    train, val = [], []
    for is_val, text in docs:
        (val if is_val else train).append(np.array(encode_document(worker_enc, text), dtype=worker_dtype))
    join = lambda arrays: np.concatenate(arrays) if arrays else np.empty(0, worker_dtype)
    return join(train), np.array([len(a) for a in train], dtype=np.int64), join(val), len(val)


def tokenize_in_order(chunks, enc, dtype, num_proc):
    """Yields (tokenize_chunk(docs), tag) for each (docs, tag), in order. Unlike Pool.imap, which reads its
    whole input ahead into a queue, at most 2 * num_proc chunks are in flight, so memory stays bounded."""
    if num_proc == 1:
        init_worker(enc, dtype)
        for docs, tag in chunks:
            yield tokenize_chunk(docs), tag
        return
    # spawn: workers start clean instead of inheriting the parent's threads (pyarrow) through fork
    with multiprocessing.get_context("spawn").Pool(num_proc, init_worker, (enc, dtype)) as pool:
        pending = deque()
        for docs, tag in chunks:
            pending.append((pool.apply_async(tokenize_chunk, (docs,)), tag))
            if len(pending) >= 2 * num_proc:
                result, tag = pending.popleft()
                yield result.get(), tag
        while pending:
            result, tag = pending.popleft()
            yield result.get(), tag

# -----------------------------------------------------------------------------
# The output directory: shards train_000000.bin, val_000000.bin, ... and meta.json, which is rewritten
# (atomically) after every pair of shards and records the progress an interrupted run resumes from.


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def remove_outputs(out_dir, keep=()):
    """Delete this script's files in out_dir except `keep`: the unconfirmed shards of an interrupted run,
    or everything when a fresh run fails on bad input."""
    for name in os.listdir(out_dir):
        if name not in keep and (name == "meta.json" or name.endswith((".bin", ".tmp"))):
            os.remove(os.path.join(out_dir, name))


def start_or_resume(out_dir, meta):
    """The meta to continue from: `meta` for a fresh run, or out_dir's meta.json if it was made with the same
    tokenizer and settings. Anything else in out_dir is an error, so shards are never mixed up."""
    meta_path = os.path.join(out_dir, "meta.json")
    if not os.path.exists(meta_path):
        if os.path.isdir(out_dir) and any(not name.endswith(".tmp") for name in os.listdir(out_dir)):
            raise SystemExit(f"--out_dir={out_dir} is not empty and has no meta.json; use an empty or new directory")
        return meta
    with open(meta_path) as f:
        old = json.load(f)
    if old["tokenizer"]["sha256"] != meta["tokenizer"]["sha256"]:
        old_tok = old["tokenizer"]
        raise SystemExit(f"--out_dir={out_dir} holds shards of a different tokenizer ({old_tok['family']} from "
                         f"{old_tok['spec']}, n_vocab {old_tok['n_vocab']}); use another --out_dir")
    changed = [key for key in meta["settings"] if old["settings"].get(key) != meta["settings"][key]]
    if changed:
        raise SystemExit(f"--out_dir={out_dir} was prepared with different settings ({', '.join(changed)}); "
                         f"use another --out_dir")
    return old


def describe_source(args):
    """Everything that determines the document stream; recorded in meta.json and checked on resume."""
    if args.source == "fineweb-edu":
        return dict(source=args.source, fineweb_config=args.fineweb_config, text_field=args.text_field)
    if args.source == "builtin":  # the help topics differ between Python versions
        return dict(source=args.source, python=sys.version.split()[0])
    files = resolve_files(args.source)
    if BUILDERS[os.path.splitext(files[0])[1]] == "text":
        return dict(source=args.source, files=files, txt_sample_by=args.txt_sample_by)
    return dict(source=args.source, files=files, text_field=args.text_field)


def prepare(args, command):
    enc = load_tokenizer(args.tokenizer)
    fits = "uint16" if enc.max_token_value < 2 ** 16 else "uint32"
    if args.dtype == "uint16" and fits == "uint32":
        raise SystemExit(f"--dtype=uint16 cannot hold token ids up to {enc.max_token_value}; use uint32 or auto")
    dtype = fits if args.dtype == "auto" else args.dtype
    tokenizer = tokenizer_info(enc, args.tokenizer)
    settings = dict(tokenizer_sha256=tokenizer["sha256"], dtype=dtype, source=describe_source(args),
                    val_every=args.val_every, shard_tokens=args.shard_tokens, max_tokens=args.max_tokens)
    meta = dict(format_version=VERSION, complete=False, tokenizer=tokenizer, vocab_size=enc.n_vocab, dtype=dtype,
                splits={split: dict(tokens=0, documents=0, shards=[]) for split in ("train", "val")},
                settings=settings, progress=dict(shards=0, documents_read=0, stream_state=None), command=command)
    meta = start_or_resume(args.out_dir, meta)
    if meta["complete"]:
        print(f"{args.out_dir} is already complete ({meta['splits']['train']['tokens']:,} train tokens)")
        return meta
    ds, text_field = open_source(meta["settings"]["source"])  # before anything is written
    if meta["progress"]["stream_state"] is not None:
        ds.load_state_dict(meta["progress"]["stream_state"])
    fresh = meta["progress"]["shards"] == 0
    os.makedirs(args.out_dir, exist_ok=True)
    confirmed = [name for split in meta["splits"].values() for name in split["shards"]]
    remove_outputs(args.out_dir, keep={"meta.json", *confirmed})
    write_json(os.path.join(args.out_dir, "meta.json"), meta)
    try:
        tokenize_to_shards(args, enc, meta, ds, text_field)
    except SystemExit:
        if fresh:  # bad input found while streaming: leave no partial output behind
            remove_outputs(args.out_dir)
            if not os.listdir(args.out_dir):
                os.rmdir(args.out_dir)
        raise
    return meta


def tokenize_to_shards(args, enc, meta, ds, text_field):
    progress, splits = meta["progress"], meta["splits"]
    chunks = document_chunks(ds, text_field, progress["documents_read"], args.val_every)
    buffers = {"train": [], "val": []}  # token arrays not written yet

    def flush(documents_read, stream_state):
        """Write the buffers as shard pair number progress["shards"], then record that in meta.json."""
        for split, arrays in buffers.items():
            if any(len(a) for a in arrays):
                name = f"{split}_{progress['shards']:06d}.bin"
                write_shard(os.path.join(args.out_dir, name), arrays, meta["dtype"])
                splits[split]["shards"].append(name)
            arrays.clear()
        progress.update(shards=progress["shards"] + 1, documents_read=documents_read, stream_state=stream_state)
        write_json(os.path.join(args.out_dir, "meta.json"), meta)  # only now do these shards count as written

    # tokens/s is measured from here, after the fixed cost of opening the stream (importing datasets and torch)
    t0, tokens_before = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
    last_print = t0
    position = (progress["documents_read"], progress["stream_state"])  # the stream position after the buffers
    for (train_ids, lengths, val_ids, n_val), position in tokenize_in_order(chunks, enc, meta["dtype"], args.num_proc):
        budget = args.max_tokens - splits["train"]["tokens"]
        if args.max_tokens and len(train_ids) > budget:  # keep the train tokens within --max_tokens
            train_ids, lengths = train_ids[:budget], lengths[np.cumsum(lengths) - lengths < budget]
        for split, ids, n_docs in (("train", train_ids, len(lengths)), ("val", val_ids, n_val)):
            buffers[split].append(ids)
            splits[split]["tokens"] += len(ids)
            splits[split]["documents"] += n_docs
        if args.max_tokens and splits["train"]["tokens"] >= args.max_tokens:
            break  # the final flush below writes these
        if sum(len(a) for a in buffers["train"]) >= args.shard_tokens:
            flush(*position)
        if time.time() - last_print >= 1.0:
            last_print, tokens = time.time(), splits["train"]["tokens"] + splits["val"]["tokens"]
            rate = (tokens - tokens_before) / (last_print - t0)
            print(f"\r{position[0]:,} documents | {tokens:,} tokens | {rate:,.0f} tokens/s", end="", file=sys.stderr,
                  flush=True)
    elapsed = time.time() - t0
    print(file=sys.stderr)
    if position[0] == 0:
        raise SystemExit(f"--source={args.source}: no documents (the input is empty)")
    if splits["train"]["tokens"] == 0 or splits["val"]["tokens"] == 0:
        raise SystemExit(f"--source={args.source}: only {position[0]} document(s), too few for a train and a "
                         f"val split (a .txt file is one document unless --txt_sample_by=paragraph or line)")
    meta["complete"] = True
    flush(*position)  # the last shards and the completed meta.json, in one step
    train, val = splits["train"], splits["val"]
    rate = (train["tokens"] + val["tokens"] - tokens_before) / elapsed
    print(f"wrote {args.out_dir}: train {train['tokens']:,} tokens in {train['documents']:,} documents, val "
          f"{val['tokens']:,} tokens in {val['documents']:,} documents ({meta['dtype']}); {rate:,.0f} tokens/s "
          f"with --num_proc={args.num_proc}")

# -----------------------------------------------------------------------------


KEYS = dict(
    source=Key("builtin", "fineweb-edu | builtin (offline: Python's help topics) | comma-separated paths/globs of "
                          ".txt, .jsonl/.json or .parquet files (one type per run)"),
    tokenizer=Key("bytes", "bytes | a tiktoken BPE file | a Hugging Face model or tokenizer directory with a byte-level "
                           "BPE tokenizer (tokenizer.json, or vocab.json + merges.txt, or original/tokenizer.model)"),
    out_dir=Key(None, "where the shards and meta.json go", types=(str,), required=True),
    num_proc=Key(os.cpu_count() or 1, "tokenizer processes", min=1),
    max_tokens=Key(0, "stop after this many train tokens (0: no limit)", min=0),
    fineweb_config=Key("sample-10BT", "FineWeb-Edu config, e.g. sample-100BT"),
    text_field=Key("text", "the text column of .jsonl/.json/.parquet and FineWeb-Edu"),
    txt_sample_by=Key("document", "what one document of a .txt file is", choices=("document", "paragraph", "line")),
    val_every=Key(100, "hold out documents 0, k, 2k, ... for validation", min=2),
    shard_tokens=Key(100_000_000, "train tokens per shard (a shard ends at the first chunk boundary past this)", min=1),
    dtype=Key("auto", "token storage; auto: uint16 if the vocabulary fits, else uint32",
              choices=("auto", "uint16", "uint32")),
)


def parse_args(argv):
    return SimpleNamespace(**parse(argv, KEYS, "Tokenize a corpus into train/val shards.", prog="prepare_data.py"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return prepare(parse_args(argv), shlex.join(["python", "prepare_data.py", *argv]))


if __name__ == "__main__":
    main()
