"""GLDv2 training CSVs plus the Revisited Oxford/Paris retrieval ground truth (``gnd_*.pkl``).

Layout under ``dataset.root``:
  <train_csv>   train.csv (id,url,landmark_id) or train_clean.csv (landmark_id,images)
  <train_images_dir>/a/b/c/abc....jpg
  <set>/gnd_<set>.pkl, <set>/jpg/<name>.jpg   for each of ``revisited_sets`` (e.g. roxford5k)

Training rows have source_split ``train``. Each revisited set contributes its queries (source_split
``query``, with the protocol's bounding box in the crop columns, applied when the image is loaded)
and its database images (``gallery``); both name their set in ``revisited_set`` (empty for training
rows). Query rows carry the protocol's ground truth as space-separated gallery item ids of their
set in ``gnd_easy``, ``gnd_hard`` and ``gnd_junk``: the evaluator ranks each set's queries against
that set's gallery only and scores them under the Easy/Medium/Hard protocols
(``modelupgrade.evaluation.revisited``). Labels of evaluation rows name the query's landmark
(gallery images positive for no query fall in "<set>/distractor"); the evaluator does not score
revisited queries by them. The ``gnd_*.pkl`` files are pickles, read with an allowlist of data types
(``modelupgrade.data.pickles``), so a tampered copy is refused instead of running code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from modelupgrade.data.loaders.base import LOADERS, DatasetLoader, read_image_files
from modelupgrade.data.manifest import (
    CROP_COLUMNS,
    GROUND_TRUTH_COLUMNS,
    REVISITED_SET_COLUMN,
    contiguous_labels,
    make_manifest,
)
from modelupgrade.data.pickles import load_data_pickle
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch


def gldv2_image_path(images_dir: str, image_id: str) -> str:
    return f"{images_dir}/{image_id[0]}/{image_id[1]}/{image_id[2]}/{image_id}.jpg"


def _landmark_of(query_name: str) -> str:
    return re.sub(r"_\d+$", "", query_name)


def load_ground_truth(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(
            f"ground-truth file {path} does not exist",
            hint="place the Revisited Oxford/Paris gnd_<set>.pkl next to its jpg/ folder, or "
            "remove the set from dataset.gldv2.revisited_sets",
        )
    # The revisitop ground truth is distributed as a pickle; it is read restricted to data.
    gnd = load_data_pickle(path, "ground-truth file")
    if not isinstance(gnd, dict) or not {"imlist", "qimlist", "gnd"} <= set(gnd):
        raise UserError(f"ground-truth file {path} must be a dict with imlist, qimlist and gnd")
    if len(gnd["gnd"]) != len(gnd["qimlist"]):
        raise UserError(
            f"ground-truth file {path} has a size mismatch: {len(gnd['gnd'])} entries for "
            f"{len(gnd['qimlist'])} queries"
        )
    return gnd


@LOADERS.register("gldv2")
class Gldv2Loader(DatasetLoader):
    def training_rows(self) -> pd.DataFrame:
        config = self.params.gldv2
        csv = self.require_root() / config.train_csv
        if not csv.is_file():
            raise UserError(
                f"GLDv2 training CSV {csv} does not exist", hint="set dataset.gldv2.train_csv"
            )
        table = pd.read_csv(csv, dtype=str, keep_default_na=False)
        if {"landmark_id", "images"} <= set(table.columns):
            table = table.assign(id=table["images"].str.split()).explode("id")[
                ["id", "landmark_id"]
            ]
        elif not {"id", "landmark_id"} <= set(table.columns):
            raise UserError(
                f"GLDv2 training CSV {csv} needs columns id,landmark_id (train.csv) or "
                f"landmark_id,images (train_clean.csv); it has {list(table.columns)}"
            )
        table = table[table["id"].fillna("").str.len() >= 3]
        return pd.DataFrame(
            {
                "item_id": "gldv2/" + table["id"],
                "class_key": "gldv2/" + table["landmark_id"],
                "source_split": self.params.train_split,
                "path": [gldv2_image_path(config.train_images_dir, i) for i in table["id"]],
            }
        )

    def evaluation_rows(self, name: str) -> pd.DataFrame:
        gnd = load_ground_truth(self.root / name / f"gnd_{name}.pkl")
        gallery_ids = [f"{name}/gallery/{im}" for im in gnd["imlist"]]
        gallery_class = [f"{name}/distractor"] * len(gallery_ids)
        rows: list[dict[str, object]] = []
        for query, truth in zip(gnd["qimlist"], gnd["gnd"], strict=True):
            landmark = f"{name}/{_landmark_of(query)}"
            for position in [*truth.get("easy", []), *truth.get("hard", [])]:
                if gallery_class[position] == f"{name}/distractor":
                    gallery_class[position] = landmark
            bbox = (
                [float(v) for v in truth["bbx"]] if truth.get("bbx") is not None else [np.nan] * 4
            )
            rows.append(
                {
                    "item_id": f"{name}/query/{query}",
                    "class_key": landmark,
                    "source_split": "query",
                    "path": f"{name}/jpg/{query}.jpg",
                    REVISITED_SET_COLUMN: name,
                    **dict(zip(CROP_COLUMNS, bbox, strict=True)),
                    **{
                        column: " ".join(gallery_ids[i] for i in truth.get(kind, []))
                        for column, kind in zip(
                            GROUND_TRUTH_COLUMNS, ("easy", "hard", "junk"), strict=True
                        )
                    },
                }
            )
        gallery = pd.DataFrame(
            {
                "item_id": gallery_ids,
                "class_key": gallery_class,
                "source_split": "gallery",
                "path": [f"{name}/jpg/{im}.jpg" for im in gnd["imlist"]],
                REVISITED_SET_COLUMN: name,
            }
        )
        return pd.concat([pd.DataFrame(rows), gallery], ignore_index=True)

    def build_manifest(self) -> pd.DataFrame:
        parts = [self.training_rows()]
        parts += [self.evaluation_rows(name) for name in self.params.gldv2.revisited_sets]
        table = pd.concat(parts, ignore_index=True)
        for column in CROP_COLUMNS:
            table[column] = table[column].astype(np.float64) if column in table else np.nan
        for column in (REVISITED_SET_COLUMN, *GROUND_TRUTH_COLUMNS):
            table[column] = table[column].fillna("").astype(object) if column in table else ""
        labels, key_names = contiguous_labels(table["class_key"])
        return make_manifest(
            item_id=table["item_id"].to_numpy(dtype=object),
            label=labels,
            class_names=key_names,
            source_split=table["source_split"].to_numpy(dtype=object),
            path=table["path"].to_numpy(dtype=object),
            index=-1,
            extra={
                c: table[c].to_numpy()
                for c in (*CROP_COLUMNS, REVISITED_SET_COLUMN, *GROUND_TRUTH_COLUMNS)
            },
        )

    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        return read_image_files(self, frame, self.params.image_size)
