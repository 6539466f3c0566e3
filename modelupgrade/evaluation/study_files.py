"""A scenario's evaluation files: the embedding sets it reads from the study's layout, the
evaluator of its split files, and the matrix, summary and heatmap files it writes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation import cross_model
from modelupgrade.evaluation.retrieval import RetrievalEvaluator
from modelupgrade.evaluation.summary import ChainEvaluation, ScenarioEvaluation
from modelupgrade.io import file_sha256, save_parquet, write_json, write_text
from modelupgrade.layout import (
    CROSS_MODEL,
    GALLERY_SPLIT,
    PER_QUERY_AP_FILE,
    QUERY_SPLIT,
    SUMMARY,
    StudyLayout,
    embedding_file_name,
)


def load_embeddings(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{what} embeddings {path} do not exist", hint="run the embed stage first")
    array = np.load(path, allow_pickle=False)
    if array.ndim != 2:
        raise UserError(f"{path} must hold a 2-D (N, D) array, got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.float32)


def load_model_sets(directory: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    return (
        load_embeddings(directory / embedding_file_name(QUERY_SPLIT), f"{name} query"),
        load_embeddings(directory / embedding_file_name(GALLERY_SPLIT), f"{name} gallery"),
    )


def write_outputs(
    result: Any,
    summary_rows: pd.DataFrame,
    summary: ScenarioEvaluation | ChainEvaluation,
    out_dir: Path,
    plot_path: Path,
    heatmap_metrics: Sequence[str],
    queries: Sequence[str],
    galleries: Sequence[str],
    title: str,
) -> None:
    save_parquet(out_dir / f"{CROSS_MODEL}.parquet", result.table)
    save_parquet(out_dir / PER_QUERY_AP_FILE, result.per_query_table())
    write_text(out_dir / f"{CROSS_MODEL}.csv", result.table.to_csv(index=False))
    write_json(
        out_dir / f"{CROSS_MODEL}.json",
        {
            "protocol": summary.protocol,
            "matrix": result.wide().to_dict(orient="records"),
            "search": {f"{q} -> {g}": info.get("search") for (q, g), info in result.info.items()},
        },
    )
    write_text(out_dir / f"{SUMMARY}.csv", summary_rows.to_csv(index=False))
    write_json(out_dir / f"{SUMMARY}.json", summary.as_dict())
    cross_model.write_heatmap(result, heatmap_metrics, plot_path, queries, galleries, title)


def source_entry(path: Path) -> dict[str, str]:
    return (
        {"path": str(path), "sha256": file_sha256(path)} if path.is_file() else {"path": str(path)}
    )


def scenario_evaluator(
    params: Params, layout: StudyLayout, scenario: str, device: Any
) -> RetrievalEvaluator:
    """The evaluator of a scenario's query and gallery split files (labels, protocol, and the
    revisited sets' ground truth where the rows carry it); it must compute the headline metric."""
    evaluator = RetrievalEvaluator.from_split_files(
        params.evaluation,
        layout.split_file(scenario, QUERY_SPLIT),
        layout.split_file(scenario, GALLERY_SPLIT),
        device,
    )
    evaluator.require_metric(params.evaluation.headline_metric, "evaluation.headline_metric")
    return evaluator
