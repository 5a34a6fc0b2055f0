"""
meta.json's fields and the types prepare_data.py writes them with. check_meta, which read_meta and
a resumed prepare_data.py apply, names a field edited by hand or damaged by a bad copy in one line,
where a reader far from here would stop with a traceback ('>' not supported between 'str' and
'int'). The sha256s of a Hugging Face tokenizer's files (TOKENIZER_FILES), recorded in meta.json,
let distill.py check a teacher without rebuilding its tokenizer.
"""
import hashlib
import os

from lmkit.errors import RunError

# lmkit/tokenizer.py's loader reads these files of a Hugging Face directory and no other (it takes
# the names from here; tests/test_tokenizer.py checks), so their sha256s cover all that decides it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "original/tokenizer.model")

# Every field of meta.json, by its dotted name, with the types prepare_data.py writes it with.
# Every reader of shards needs the REQUIRED ones; the others, some added over time, are checked
# where present, so data prepared before them still reads.
NONE = type(None)
STRING_LISTS = ("prefix", "suffix", "inline", "inline_normalized")  # tokenizer lists of strings
SPLIT_FIELDS = dict(tokens=int, documents=int, shards=list, dropped_bytes=int)
META_FIELDS = {
    "format_version": int, "complete": bool, "vocab_size": int, "dtype": str, "tokenizer": dict,
    **{f"tokenizer.{key}": str for key in ("spec", "sha256", "family", "pattern")},
    "tokenizer.nfc": bool, "tokenizer.n_vocab": int, "tokenizer.special_tokens": dict,
    "tokenizer.bos_id": (int, NONE), "tokenizer.eos_id": (int, NONE), "tokenizer.boundary": str,
    "tokenizer.bos_token": (str, NONE), "tokenizer.eos_token": (str, NONE),
    **{f"tokenizer.{key}": list for key in (*STRING_LISTS, "missing_bytes")},
    "tokenizer.unk": (list, NONE), "tokenizer.files": list,
    "splits": dict, "splits.train": dict, "splits.val": dict,
    **{f"splits.{split}.{key}": types
       for split in ("train", "val") for key, types in SPLIT_FIELDS.items()},
    "checksums": dict, "settings": dict, "progress": dict, "progress.shards": int,
    "progress.documents_read": int, "progress.stream_state": (dict, NONE), "command": str,
}
REQUIRED = {"vocab_size", "splits", "splits.train.shards", "splits.val.shards"}
# what the elements of a field that holds several must be
ELEMENTS = {"splits.train.shards": str, "splits.val.shards": str, "checksums": str,
            "tokenizer.special_tokens": int, "tokenizer.missing_bytes": int,
            "tokenizer.files": dict, **{f"tokenizer.{key}": str for key in STRING_LISTS}}
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
    for name, types in META_FIELDS.items():
        *parents, key = name.split(".")
        parent, types = meta, types if isinstance(types, tuple) else (types,)
        for step in parents:
            parent = parent.get(step)
        if parent is None or (key not in parent and name not in REQUIRED):
            continue  # an optional field, or one whose optional parent is not there
        if key not in parent:
            return f"has no {name}"
        values = [parent[key]]
        if name in ELEMENTS and not wrong_type(values[0], types):
            name, types = f"an element of {name}", (ELEMENTS[name],)
            values = values[0].values() if isinstance(values[0], dict) else values[0]
        if wrong := [value for value in values if wrong_type(value, types)]:
            return (f"{name} is {described(wrong[0])}, where prepare_data.py writes "
                    f"{' or '.join(JSON_WORDS[t] for t in types)}")
    if meta.get("dtype", "uint16") not in ("uint16", "uint32"):
        return f"dtype is {meta['dtype']!r}, where prepare_data.py writes uint16 or uint32"
    return None


def check_meta(meta, path):
    """meta, read from path, or a RunError naming its first wrong field (meta_problem)."""
    if problem := meta_problem(meta):
        raise RunError(f"{path}: {problem}: the file was edited or damaged; prepare the data "
                       "again into a new --out_dir")
    return meta


def tokenizer_files(directory):
    """{name: sha256 of its bytes} of the TOKENIZER_FILES that directory holds. meta.json's
    tokenizer.files lists such dicts, each a set of files known to build the data's tokenizer."""
    found = {}
    for name in TOKENIZER_FILES:
        if os.path.isfile(path := os.path.join(directory, name)):
            with open(path, "rb") as f:
                found[name] = hashlib.sha256(f.read()).hexdigest()
    return found


def files_mismatch(found, tokenizer):
    """None where found (a directory's tokenizer_files) is a set that meta.json's tokenizer.files
    lists; else why: it lists none, or how found differs from the nearest set, file by file."""
    known = tokenizer.get("files")
    if not known:
        why = ("an older prepare_data.py prepared it" if known is None
               else "its tokenizer was not read from a directory")
        return f"the data's meta.json records none ({why})"
    how = {(True, True): "other bytes", (True, False): "only in the directory",
           (False, True): "not in the directory"}
    differences = [[f"{name} ({how[name in found, name in files]})"
                    for name in sorted({*found, *files}) if found.get(name) != files.get(name)]
                   for files in known]
    return ", ".join(min(differences, key=len)) or None
