"""Tests for checkpoint.py: our ckpt.pt written atomically and read with one-line errors."""
import pytest
import torch

import checkpoint


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt.pt')
    checkpoint.save_checkpoint(path, {'step': 1})

    def crash(obj, f):
        f.write(b'half a checkpoint')
        raise OSError('disk full')
    monkeypatch.setattr(torch, 'save', crash)
    with pytest.raises(OSError, match='disk full'):
        checkpoint.save_checkpoint(path, {'step': 2})
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {'step': 1}
