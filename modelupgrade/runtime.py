"""Logging, seeding and device choice: the one place where the process environment is set up."""

from __future__ import annotations

import logging
import os
import random
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: every stage imports this module (logging),
# and a stage that never touches a tensor (prepare, split, validate, register, report) should not
# pay torch's two seconds of import.

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int | None = None) -> None:
    """Configure root logging once; ``MODELUPGRADE_LOG_LEVEL`` overrides the default INFO."""
    level = level or os.environ.get("MODELUPGRADE_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format=_LOG_FORMAT, force=True)
    # Third-party libraries are chatty at INFO; keep the pipeline's own messages readable.
    for noisy in (
        *("urllib3", "alembic", "git", "matplotlib", "PIL", "filelock", "httpx", "faiss"),
        "milvus_lite",  # an engine start, stop and index build per command
        "great_expectations",  # ~60 lines of its own decorator registrations per context
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator for code that wants its own stream."""
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def enable_determinism() -> None:
    """Make CPU runs bit-reproducible for a seed (GPU kernels may still be non-deterministic)."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = False


def select_device(preference: str = "auto") -> torch.device:
    """Return CUDA when present (or asked for), else CPU.

    ``preference`` is "auto", "cpu", "cuda" or "cuda:N"; ``MODELUPGRADE_DEVICE`` overrides "auto".
    """
    import torch

    from modelupgrade.errors import UserError

    if preference == "auto":
        preference = os.environ.get("MODELUPGRADE_DEVICE", "auto")
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(preference)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device {preference!r} was requested but no CUDA GPU is available",
            hint="set device to 'auto' or 'cpu' in params.yaml (or MODELUPGRADE_DEVICE)",
        )
    return device


def describe_device(device: torch.device) -> str:
    """A human-readable name of the device for reports and model cards."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
