"""Writing and reading a directory of split files (``<split>.parquet`` + ``split_info.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from modelupgrade.data.manifest import check_manifest_columns
from modelupgrade.data.scenarios import Splits
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path

INFO_FILE = "split_info.json"


def write_splits(directory: str | Path, splits: Splits) -> None:
    """Write every split and the info file into ``directory``, replacing it as a whole."""
    with atomic_path(directory) as tmp:
        tmp.mkdir()
        for name, frame in splits.frames.items():
            frame.reset_index(drop=True).to_parquet(tmp / f"{name}.parquet", index=False)
        info = {**splits.info, "sizes": splits.sizes()}
        (tmp / INFO_FILE).write_text(
            json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )


def read_splits(directory: str | Path) -> Splits:
    directory = Path(directory)
    info_path = directory / INFO_FILE
    if not info_path.is_file():
        raise UserError(f"{directory} holds no {INFO_FILE}", hint="run the split stage first")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    frames = {}
    for name in info.get("sizes", {}):
        path = directory / f"{name}.parquet"
        if not path.is_file():
            raise UserError(f"split file {path} is missing", hint="rerun the split stage")
        frames[name] = pd.read_parquet(path)
        check_manifest_columns(frames[name], str(path))
    return Splits(frames, info)


def split_directories(root: str | Path) -> list[Path]:
    """Every split directory under ``root`` (those holding a split_info.json), sorted."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"the splits root {root} is not a directory", hint="run the split stage first"
        )
    return sorted(d for d in root.iterdir() if (d / INFO_FILE).is_file())
