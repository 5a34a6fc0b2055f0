"""The sink study (sink_study.py) and what it rests on: windows that start with a fixed token, the standard-library
corpus, the study's measurements against an independent recomputation, its verdicts, and the README's numbers."""
import json
import os
import statistics

import numpy as np
import pytest

import prepare_data
from data import Windows, first_token_id, prefix_id, read_meta, read_shard
from files import RunError


def test_prefix_windows_start_with_the_token_and_cover_every_token_once(data_dir):
    """first_token='prefix': every window is [token] + block_size - 1 stream tokens, and its targets are the next
    block_size stream tokens; windows do not overlap, so each stream token is a target exactly once."""
    T = 64
    token = prefix_id(read_meta(data_dir)['tokenizer'])
    assert token == 256  # the bytes tokenizer has no BOS: its <|endoftext|>
    windows = Windows(data_dir, 'train', T, token)
    stream = np.asarray(read_shard(os.path.join(data_dir, 'train_000000.bin')))
    assert len(windows) == len(stream) // T
    x, y = windows.get(range(len(windows)))
    assert (x[:, 0] == token).all() and x.shape == y.shape == (len(windows), T)
    assert (x[:, 1:] == y[:, :-1]).all()
    assert (y.reshape(-1) == stream[:len(windows) * T]).all()  # every target once, in stream order
    # the default windows are what they were: block_size + 1 tokens from k * block_size
    x, y = Windows(data_dir, 'train', T).get([3])
    assert (x[0] == stream[3 * T:4 * T]).all() and y[0, -1] == stream[4 * T]
    assert first_token_id({}, read_meta(data_dir)['tokenizer']) is None  # a run from before the key
    assert first_token_id({'first_token': 'prefix'}, read_meta(data_dir)['tokenizer']) == 256


def test_prefix_needs_a_token():
    with pytest.raises(RunError, match="neither a BOS nor an end-of-text token"):
        prefix_id(dict(spec='tok', bos_id=None, eos_id=None))


def test_stdlib_corpus_is_recorded(tmp_path):
    """--source=stdlib: the standard library's .py files, their count, size and sha256 in meta.json."""
    documents, described = prepare_data.stdlib_corpus()
    assert described['files'] == len(documents) > 500 and described['bytes'] > 5_000_000
    out = tmp_path / 'stdlib'
    prepare_data.main(['--source=stdlib', '--tokenizer=bytes', f'--out_dir={out}', '--val_every=50', '--num_proc=1',
                       '--max_tokens=20000'])
    source = read_meta(out)['settings']['source']
    assert source['corpus'] == described and source['python']
    first = read_shard(str(out / 'train_000000.bin'))[:200]
    assert bytes(first.astype(np.uint8)) == documents[1].encode()[:200]  # document 0 is held out (0 mod 50)
