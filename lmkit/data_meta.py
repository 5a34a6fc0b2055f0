"""
meta.json's fields, each with the type prepare_data.py writes it with, and check_meta, which
lmkit.data.read_meta and a resumed prepare_data.py run hold every meta.json to: a field edited by
hand or damaged by a bad copy is named in one line, where a reader far from here would otherwise
stop with a traceback (a vocab_size that is a string: '>' not supported between 'str' and 'int').
"""
from lmkit.errors import RunError

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
    (("tokenizer", "unk"), (list, NONE), OPTIONAL),
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
            ("tokenizer", "missing_bytes"): int}
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
