"""Shared setup of flash3's Python tests.

They import flash3 as installed (`pip install .`, which puts libflash3_c.so in
the package) when it is, else from this checkout's python/ (CPU CI: no library,
every GPU test skipped with its reason); the report header says which. Each
test module skips itself, saying so, where PyTorch is not installed.
"""
import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("flash3") is None:
    sys.path.insert(0, os.path.join(REPO, "python"))


def pytest_report_header(config):
    if importlib.util.find_spec("torch") is None:
        return "flash3: PyTorch is not installed"
    import flash3
    return f"flash3 from {os.path.dirname(flash3.__file__)}; library {flash3._abi.library_path()}"


def _gpu_skip_reason():
    """Why the GPU tests cannot run here, or None."""
    import torch
    import flash3
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        flash3._abi.load()
    except flash3.LibraryError as e:
        return f"libflash3_c not built or unusable: {e}"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"not a Hopper GPU (sm_90): {torch.cuda.get_device_name()}"
    return None


@pytest.fixture(scope="session")
def gpu():
    """The CUDA device; skips the test, saying why, unless a Hopper GPU and a
    usable libflash3_c are here."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    return torch.device("cuda")
