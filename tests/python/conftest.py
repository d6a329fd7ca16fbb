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
    if not os.path.exists(flash3._abi.library_path()):
        return f"libflash3_c not built ({flash3._abi.library_path()} does not exist)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"not a Hopper GPU (sm_90): {torch.cuda.get_device_name()}"
    return None


@pytest.fixture(scope="session")
def gpu():
    """The CUDA device, with the library loaded; skips the test, saying why,
    without a Hopper GPU or a built libflash3_c. A library that is there but
    unusable (not loadable, or its structs' layout not this package's) fails
    every GPU test instead: that is a bug, not a missing prerequisite."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    import flash3
    flash3._abi.load()
    return torch.device("cuda")
