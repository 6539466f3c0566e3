"""Where a team's upgrade (params.yaml's ``upgrades.<name>``) reads from: every file under its
``inputs`` directory, the one data dependency of dvc.yaml's ``upgrade@<name>``."""

from __future__ import annotations

from pathlib import Path

from modelupgrade.config import Params
from modelupgrade.errors import UserError


def check_upgrade_inputs(params: Params, name: str) -> None:
    """Every file upgrade ``name`` reads (its models' files, its tables, the images they name)
    lies under its inputs directory: a file outside it would change without dvc repro noticing."""
    entry = params.upgrades[name]
    inputs = Path(entry.inputs).resolve()
    if not inputs.is_dir():
        raise UserError(
            f"upgrades.{name}.inputs {entry.inputs} is not a directory",
            hint="put the models' files, the sample tables and the images in one directory and "
            "name it there",
        )
    read: list[tuple[str, str]] = [
        (f"adopted.{model}.options.path", str(params.adopted[model].options.get("path", "")))
        for model in (entry.old, entry.new)
    ]
    for role, table in entry.files().items():
        read += [(f"upgrades.{name}.{role}", table)]
        read += [
            (f"an image of upgrades.{name}.{role}", path)
            for path in _image_paths(name, role, table)
        ]
    outside = [(what, path) for what, path in read if not _under(Path(path), inputs)]
    if outside:
        what, path = outside[0]
        raise UserError(
            f"{what} {path} lies outside upgrades.{name}.inputs ({entry.inputs}): dvc repro "
            f"would not see it change ({len(outside)} such file(s))",
            hint=f"move it under {entry.inputs}, or make inputs a directory that holds it",
        )


def _image_paths(name: str, role: str, table: str) -> list[str]:
    from modelupgrade.data.image_table import read_image_rows

    rows = read_image_rows(table, f"upgrades.{name}.{role}")
    paths = [str(path) for path in rows["path"] if str(path)]
    if len(paths) < len(rows):
        raise UserError(
            f"upgrades.{name}.{role} {table} names {len(rows) - len(paths)} images by their "
            "index in a dataset, not by a path",
            hint="give a table of item_id, label and path (each path under inputs)",
        )
    return paths


def _under(path: Path, directory: Path) -> bool:
    return bool(str(path)) and path.resolve().is_relative_to(directory)
