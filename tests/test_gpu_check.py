"""tools/gpu_check.py, the GPU acceptance run (what python -m tools.bench --check hands over to:
tests/test_bench.py and tests/test_faults.py hold the hand-over), on a machine without a GPU: its
CPU parts for real, and the rows it gives where a GPU image lacks what a part needs."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tools import gpu_check

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]


def test_check_on_a_machine_without_a_gpu(tmp_path, capsys, monkeypatch):
    """Without CUDA: the CPU parts (the kernel tests on CPU; train.py under torchrun with a KD
    teacher, stopped by SIGTERM and resumed under FSDP, its checkpoint loaded back) pass, the GPU
    parts are named as skipped, exit status 0; one Markdown table, and the same rows in the JSON
    file. Run in this process: the parts' own subprocesses (pytest, train.py under torchrun) are
    what is checked, and a process around them would only add its start. The kernel tests are cut to
    the first file's softmax cases (this suite runs them all)."""
    (path, expression), *_ = gpu_check.KERNEL_TESTS['cpu']
    monkeypatch.setitem(gpu_check.KERNEL_TESTS, 'cpu', [(path, f'{expression} and softmax')])
    json_path = tmp_path / 'check.json'
    status = gpu_check.main([f'--check_json={json_path}'])
    out, err = capsys.readouterr()
    assert status == 0, out + err[-3000:]
    assert out.lstrip('\n').startswith('## tools/gpu_check.py on CPU')
    lines = [line for line in out.splitlines() if line.startswith('|')]
    header = [cell.strip() for cell in lines[0].strip('|').split('|')]
    assert header == ['section', 'check', 'result', 'measured',
                      'target'] and lines[1] == '|' + '---|' * 5
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]
    record = json.loads(json_path.read_text())
    assert [r['check'] for r in record['rows']] == [row[1] for row in rows]
    assert [row[0] for row in rows] == ['kernels'] + ['torchrun'] * 4 + ['GPU']
    assert all(row[2] == 'pass'
               for row in rows[:-1]) and rows[-1][2] == '-' and 'none found' in rows[-1][3]
    assert 'no GPU' in record['device'] and record['torch'] == torch.__version__


def test_a_stopped_check_is_stopped_not_failed(tmp_path):
    """Issue 62: Ctrl-C during the check wrote `kernels | FAIL | Stopped: stopped by SIGINT` to its
    table and JSON, as if the machine had failed. Now the part it stopped in is a row "stopped"
    (not a pass/fail check), the record says it was stopped, the table of what ran is printed, and
    the exit status is 130 (128 + SIGINT)."""
    json_path = tmp_path / 'check.json'
    proc = subprocess.Popen([sys.executable, '-m', 'tools.gpu_check', '--check_parts=kernels',
                             f'--check_json={json_path}'], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while (line := proc.stderr.readline()) and line.strip() != 'kernels ...':
        pass
    proc.send_signal(signal.SIGINT)  # while the kernel tests run, in pytest
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.splitlines()[-1] == (
        "gpu_check.py: error: stopped by SIGINT in the kernels part: what ran before it is in the "
        f"table above and in {json_path}"), err
    record = json.loads(json_path.read_text())
    assert record['stopped'] == 'stopped by SIGINT' and [
        (r['section'], r['ok'], r['stopped']) for r in record['rows']] == [('kernels', None, True)]
    rows = [line.split('|')[1:4] for line in out.splitlines() if line.startswith('| kernels')]
    assert [[cell.strip() for cell in row] for row in rows] == [['kernels', 'ran to the end',
                                                                 'stopped']]
    assert 'FAIL' not in out + err


def test_check_skips_the_kernel_tests_where_pytest_does_not_run(tmp_path, monkeypatch):
    """A GPU box with requirements.txt alone: pytest missing, or (pytest >= 8.4) its pygments. The
    kernels part is then one skipped row that names the cause and the fix, not a failure reading "no
    output"."""
    (tmp_path / 'pygments').mkdir()
    (
        tmp_path / 'pygments' / '__init__.py').write_text(
        "raise ModuleNotFoundError(\"No module named 'pygments'\")\n")
    monkeypatch.setenv('PYTHONPATH', str(tmp_path))  # the subprocesses find this pygments first
    check = gpu_check.Check(str(tmp_path / 'check.json'),
                            dict(device='cpu', torch=torch.__version__))
    gpu_check.check_kernel_tests(check, torch.device('cpu'))
    (row,) = check.record['rows']
    assert row['section'] == 'kernels' and row['ok'] is None
    assert ("No module named 'pygments'" in row['value']
            and 'pip install -r requirements-test.txt' in row['value'])


def test_check_says_what_to_install_where_datasets_is_missing(tmp_path, monkeypatch):
    """A GPU image without `datasets` (which prepare_data.py reads even the built-in corpus
    through): the torchrun part is one skipped row naming the package and the command that installs
    it."""
    find_spec = gpu_check.importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, 'find_spec',
                        lambda name: None if name == 'datasets' else find_spec(name))
    check = gpu_check.Check(str(tmp_path / 'check.json'),
                            dict(device='cpu', torch=torch.__version__))
    gpu_check.check_torchrun(check, torch.device('cpu'), None, str(tmp_path))
    (row,) = check.record['rows']
    assert row['section'] == 'torchrun' and row['ok'] is None
    assert 'datasets' in row['value'] and 'pip install -r requirements.txt' in row['value']
    assert list(tmp_path.iterdir()) == [tmp_path / 'check.json']


def test_the_mfu_target_holds_for_the_gpus_of_the_h100s_peak():
    """The MFU target (of 989 TFLOP/s, the H100 SXM's dense bf16 peak) applies to the H100 SXM and
    the H200, which has the same peak; not to the H100 PCIe (756) or other GPUs."""
    assert gpu_check.holds_mfu_target('NVIDIA H100 80GB '
                                      'HBM3') and gpu_check.holds_mfu_target('NVIDIA H200')
    assert not gpu_check.holds_mfu_target('NVIDIA H100 PCIe')
    assert not gpu_check.holds_mfu_target('NVIDIA A100-SXM4-80GB')
