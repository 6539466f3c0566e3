"""Shared fixtures: CPU-forced, single-threaded, deterministic; GPU tests skipped without a GPU."""

from __future__ import annotations

import os

# Set before torch is imported anywhere: tests must not touch a GPU by accident or fight over cores.
os.environ.setdefault("MODELUPGRADE_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///:memory:")
os.environ.setdefault(
    "PREFECT_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "modelupgrade-prefect-tests")
)

import pytest
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    from modelupgrade.runtime import seed_everything

    seed_everything(0)


@pytest.fixture
def cpu_device() -> torch.device:
    return torch.device("cpu")
