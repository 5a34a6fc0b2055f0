"""
meta.json's fields, each with the type prepare_data.py writes it with, and check_meta, which
lmkit.data.read_meta and a resumed prepare_data.py run hold every meta.json to: a field edited by
hand or damaged by a bad copy is named in one line, where a reader far from here would otherwise
stop with a traceback (a vocab_size that is a string: '>' not supported between 'str' and 'int').
It also names the files a Hugging Face tokenizer is built from (TOKENIZER_FILES), whose sha256s
meta.json records so that distill.py can check a teacher without rebuilding its tokenizer.
"""
import hashlib
import os

from lmkit.errors import RunError

# Every file of a Hugging Face directory that lmkit/tokenizer.py's loader reads, relative to the
# directory. The loader takes its names from here, and tests/test_tokenizer.py checks that it opens
# no other, so the sha256s of tokenizer_files cover everything that decides the tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "original/tokenizer.model")

# Every field of meta.json, as (its keys from the top, the types prepare_data.py writes it with,
# and OPTIONAL unless every reader of shards needs it): the others, some added over time, are
# checked where present, so data prepared before them still reads. A field of another type (edited
# by hand, a bad copy) would otherwise stop a reader far from here, with a traceback.
OPTIONAL, NONE = False, type(None)
SPLIT_FIELDS = [(("tokens",), int, OPTIONAL), (("documents",), int, OPTIONAL),
                (("shards",), list), (("dropped_bytes",), int, OPTIONAL)]
META_FIELDS = [
    (("format_version",), int, OPTIONAL), (("complete",), bool, OPTIONAL),
    (("vocab_size",), int), (("dtype",), str, OPTIONAL), (("tokenizer",), dict, OPTIONAL),
    (("tokenizer", "spec"), str, OPTIONAL), (("tokenizer", "sha256"), str, OPTIONAL),
    (("tokenizer", "family"), str, OPTIONAL), (("tokenizer", "pattern"), str, OPTIONAL),
    (("tokenizer", "nfc"), bool, OPTIONAL), (("tokenizer", "n_vocab"), int, OPTIONAL),
    (("tokenizer", "special_tokens"), dict, OPTIONAL),
    (("tokenizer", "bos_id"), (int, NONE), OPTIONAL),
    (("tokenizer", "eos_id"), (int, NONE), OPTIONAL),
    (("tokenizer", "boundary"), str, OPTIONAL),
    (("tokenizer", "bos_token"), (str, NONE), OPTIONAL),
    (("tokenizer", "eos_token"), (str, NONE), OPTIONAL),
    *[(("tokenizer", key), list, OPTIONAL)
      for key in ("prefix", "suffix", "inline", "inline_normalized", "missing_bytes")],
    (("tokenizer", "unk"), (list, NONE), OPTIONAL), (("tokenizer", "files"), list, OPTIONAL),
    (("splits",), dict), (("splits", "train"), dict, OPTIONAL), (("splits", "val"), dict, OPTIONAL),
    *[(("splits", split, *keys), *rest) for split in ("train", "val")
      for keys, *rest in SPLIT_FIELDS],
    (("checksums",), dict, OPTIONAL), (("settings",), dict, OPTIONAL),
    (("progress",), dict, OPTIONAL), (("progress", "shards"), int, OPTIONAL),
    (("progress", "documents_read"), int, OPTIONAL),
    (("progress", "stream_state"), (dict, NONE), OPTIONAL), (("command",), str, OPTIONAL),
]
# what the elements of a field that holds several must be
ELEMENTS = {("splits", "train", "shards"): str, ("splits", "val", "shards"): str,
            ("checksums",): str, ("tokenizer", "special_tokens"): int,
            **{("tokenizer", key): str for key in ("prefix", "suffix", "inline",
                                                   "inline_normalized")},
            ("tokenizer", "missing_bytes"): int, ("tokenizer", "files"): dict}
JSON_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
              list: "a list", dict: "an object", NONE: "null"}


def described(value):
    """A JSON value and its kind, in words: '320' (a string)."""
    return f"{value!r} ({JSON_WORDS.get(type(value), type(value).__name__)})"


def wrong_type(value, types):
    """Whether value is of none of types (a bool is no int here, though Python makes it one)."""
    return not isinstance(value, types) or (isinstance(value, bool) and bool not in types)


def meta_problem(meta):
    """What is wrong with a meta.json's fields (META_FIELDS, ELEMENTS), in words, or None. A field's
    parent comes before it in META_FIELDS, so it is an object by the time its fields are read."""
    if not isinstance(meta, dict):
        return f"holds {described(meta)}, not an object"
    for keys, types, *optional in META_FIELDS:
        parent, name = meta, ".".join(keys)
        for key in keys[:-1]:
            parent = parent.get(key)
        if parent is None:  # an optional parent that is not there: none of its fields are
            continue
        if keys[-1] not in parent:
            if optional:
                continue
            return f"has no {name}"
        types = types if isinstance(types, tuple) else (types,)
        values = [parent[keys[-1]]]
        if not wrong_type(values[0], types) and keys in ELEMENTS:
            types, values = (ELEMENTS[keys],), list(
                values[0].values() if isinstance(values[0], dict) else values[0])
            name = f"an element of {name}"
        for value in values:
            if wrong_type(value, types):
                return (f"{name} is {described(value)}, where prepare_data.py writes "
                        f"{' or '.join(JSON_WORDS[t] for t in types)}")
    if meta.get("dtype", "uint16") not in ("uint16", "uint32"):
        return f"dtype is {meta['dtype']!r}, where prepare_data.py writes uint16 or uint32"
    return None


def check_meta(meta, path):
    """meta, read from path; a RunError naming its first field that is missing or of another type
    than prepare_data.py writes it with (meta_problem)."""
    problem = meta_problem(meta)
    if problem:
        raise RunError(f"{path}: {problem}: the file was edited or damaged; prepare the data "
                       "again into a new --out_dir")
    return meta


def tokenizer_files(directory):
    """{name: sha256 of its bytes} of the TOKENIZER_FILES that directory holds. meta.json's
    tokenizer.files lists such dicts, each a set of files known to build the data's tokenizer."""
    found = {}
    for name in TOKENIZER_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                found[name] = hashlib.sha256(f.read()).hexdigest()
    return found


def files_mismatch(found, tokenizer):
    """None where found (a directory's tokenizer_files) is one of the sets of files that meta.json's
    tokenizer record lists as building its tokenizer; else why not, in words: that it lists none,
    or the files by which found differs from the nearest set, each with how."""
    known = tokenizer.get("files")
    if known is None:
        return "the data's meta.json records none (an older prepare_data.py prepared it)"
    if not known:
        return "the data's meta.json records none (its tokenizer was not read from a directory)"
    if found in known:
        return None

    def how(name, files):
        return ("other bytes" if name in found and name in files
                else "only in the directory" if name in found else "not in the directory")

    return ", ".join(min(([f"{name} ({how(name, files)})" for name in sorted({*found, *files})
                           if found.get(name) != files.get(name)] for files in known), key=len))
