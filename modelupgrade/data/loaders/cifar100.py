"""CIFAR-100 in its python pickle format (``train``, ``test``, ``meta``), fine labels.

The files are pickles; ``modelupgrade.data.pickles`` reads them with an allowlist (numpy arrays,
containers, numbers, text), so a tampered copy is refused instead of running code.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from modelupgrade.data.loaders.base import LOADERS, DatasetLoader, array_files_manifest, gather_rows
from modelupgrade.data.pickles import load_data_pickle
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch

_SPLIT_FILES = ("train", "test")
_CACHE: dict[tuple[str, int, int], dict[str, object]] = {}
_CACHE_LOCK = threading.Lock()


def _unpickle(path: Path) -> dict[str, Any]:
    """Load one CIFAR pickle once per process; byte-string keys become str."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    # The CIFAR distribution format is a pickle; it is read restricted to data.
    raw = load_data_pickle(path, "CIFAR file", encoding="bytes")
    if not isinstance(raw, dict):
        raise UserError(f"CIFAR file {path} does not hold a dict (got {type(raw).__name__})")
    decoded = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
    with _CACHE_LOCK:
        _CACHE[key] = decoded
    return decoded


def _images_of(path: Path) -> np.ndarray:
    content = _unpickle(path)
    data = np.asarray(content.get("data"))
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
        raise UserError(
            f"CIFAR file {path} has a size mismatch: 'data' must be uint8 (N, 3072), got "
            f"{data.dtype} {data.shape}"
        )
    images = data.reshape(-1, 3, 32, 32)
    images.flags.writeable = False
    return images


@LOADERS.register("cifar100")
class Cifar100Loader(DatasetLoader):
    def base_dir(self) -> Path:
        root = self.require_root()
        nested = root / "cifar-100-python"
        return nested if (nested / "train").is_file() else root

    def build_manifest(self) -> pd.DataFrame:
        base = self.base_dir()
        root = self.root.resolve()
        parts = []
        for split in _SPLIT_FILES:
            path = base / split
            if not path.is_file():
                raise UserError(f"CIFAR-100 file {path} does not exist", hint=self.missing_hint())
            content = _unpickle(path)
            labels = np.asarray(content.get("fine_labels", []), dtype=np.int64)
            count = len(_images_of(path))
            if len(labels) != count:
                raise UserError(
                    f"CIFAR file {path} has a size mismatch: {len(labels)} fine "
                    f"labels for {count} images"
                )
            parts.append((split, str(path.resolve().relative_to(root)), labels))
        meta_path = base / "meta"
        if self.params.class_names is not None:
            names = list(self.params.class_names)
        elif meta_path.is_file():
            names = [
                n.decode() if isinstance(n, bytes) else str(n)
                for n in _unpickle(meta_path)["fine_label_names"]
            ]
        else:
            names = [str(i) for i in range(int(max(p[2].max() for p in parts)) + 1)]
        all_labels = np.concatenate([p[2] for p in parts])
        if all_labels.min() < 0 or all_labels.max() >= len(names):
            raise UserError(
                f"CIFAR labels fall outside 0..{len(names) - 1} (the class names in meta)"
            )
        return array_files_manifest(parts, all_labels, names, id_digits=5)

    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        import torch

        arrays = {p: _images_of(self.resolve(p)) for p in frame["path"].astype(str).unique()}
        if not arrays:
            return torch.empty((0, 3, 32, 32), dtype=torch.uint8)
        return torch.from_numpy(gather_rows(arrays, frame))
