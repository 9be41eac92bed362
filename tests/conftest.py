import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs one CUDA GPU")
    config.addinivalue_line("markers", "multigpu: needs two or more CUDA GPUs")
    config.addinivalue_line("markers", "slow: a long interpreter or multi-process test (-m 'not slow' skips)")


def pytest_collection_modifyitems(config, items):
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))


@pytest.fixture(scope="session")  # session-wide: hypothesis tests may use it
def device() -> str:
    """Where the Triton kernels run: the CPU under TRITON_INTERPRET=1, else the GPU."""
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
