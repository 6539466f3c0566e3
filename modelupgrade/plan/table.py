"""The plan for one gallery size: every measured option costed (``plan_table``), recommended on,
and written (``write_plan``)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path, write_json, write_text
from modelupgrade.plan.recommend import recommend
from modelupgrade.plan.records import PlanMeasurements, PlanRow, UpgradePlan

PLAN_JSON, PLAN_MARKDOWN, PLAN_CSV = "plan.json", "plan.md", "plan.csv"
# The fitted adapters' head directories inside a plan's directory (``adapter_head_name``).
HEADS_DIR = "heads"


def check_plan_settings(gallery_size: int, tolerance_pct: float) -> None:
    if gallery_size <= 0:
        raise UserError(
            f"--gallery-size must be a positive number of images, got {gallery_size}",
            hint="pass the number of images your production gallery holds, e.g. 50000000",
        )
    if not 0 <= tolerance_pct < 100:
        raise UserError(
            f"--tolerance-pct must be in [0, 100), got {tolerance_pct}",
            hint="the share of M(new, new) an option may lose and still be recommended, e.g. 5",
        )


def plan_table(
    measurements: PlanMeasurements, gallery_size: int, tolerance_pct: float = 5.0
) -> UpgradePlan:
    """The plan for a gallery of ``gallery_size`` images: every option's costs, and the
    recommendation (module docstring)."""
    check_plan_settings(gallery_size, tolerance_pct)
    metric = measurements.metric
    old = measurements.option("keep-old").metrics
    new = measurements.option("reembed").metrics
    assert old is not None and new is not None
    m_old, m_new = old[metric], new[metric]
    rows = []
    for option in measurements.options:
        value = None if option.metrics is None else option.metrics[metric]
        images = gallery_size if option.seconds_per_image is not None else 0
        vectors = gallery_size if option.seconds_per_vector is not None else 0
        backfill = images * (option.seconds_per_image or 0.0) + vectors * (
            option.seconds_per_vector or 0.0
        )
        rows.append(
            PlanRow(
                option=option.name,
                kind=option.kind,
                description=option.description,
                M=value,
                delta_vs_old_pct=None
                if value is None or m_old == 0
                else (value - m_old) / m_old * 100,
                of_new_new_pct=None if value is None or m_new == 0 else value / m_new * 100,
                gap_closed_pct=None
                if value is None or not m_new > m_old
                else (value - m_old) / (m_new - m_old) * 100,
                negative_flip_rate=option.negative_flip_rate,
                images_to_embed=images,
                vectors_to_transform=vectors,
                backfill_seconds=backfill,
                training_seconds=option.training_seconds,
                one_time_seconds=backfill + option.training_seconds,
                query_overhead_us=option.query_overhead_us,
                backfill_auc=option.backfill_auc,
                note=" ".join(p for p in (option.training_note, option.note) if p),
                timing_spread=option.timing_spread,
                head=option.head,
            )
        )
    recommendation = recommend(rows, metric, m_old, m_new, tolerance_pct)
    return UpgradePlan(gallery_size, tolerance_pct, metric, rows, recommendation, measurements)


def write_plan(
    plan: UpgradePlan,
    out: Path,
    heads: Path | None = None,
    next_steps: Sequence[str] = (),
    commands: Sequence[str] = (),
) -> list[Path]:
    """plan.json, plan.md and plan.csv in ``out``, with the fitted adapters' head directories
    (``heads``: a directory of them) under ``out/heads`` and the next steps (markdown lines, and
    the commands in plan.json); the directory is written whole or not at all."""
    out = Path(out)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        write_json(tmp / PLAN_JSON, {**plan.as_dict(), "next_commands": list(commands)})
        write_text(tmp / PLAN_MARKDOWN, "\n".join([plan.markdown(), *next_steps]) + "\n")
        write_text(tmp / PLAN_CSV, plan.frame().to_csv(index=False))
        if heads is not None and any(Path(heads).iterdir()):
            shutil.copytree(heads, tmp / HEADS_DIR)
    saved = sorted((out / HEADS_DIR).iterdir()) if (out / HEADS_DIR).is_dir() else []
    return [out / PLAN_JSON, out / PLAN_MARKDOWN, out / PLAN_CSV, *saved]


def read_plan(out: Path) -> UpgradePlan:
    """The plan ``write_plan`` wrote to the directory ``out``."""
    import json

    path = Path(out) / PLAN_JSON
    if not path.is_file():
        raise UserError(f"{out} holds no plan ({PLAN_JSON})", hint="run `modelupgrade plan` first")
    return UpgradePlan.from_dict(json.loads(path.read_text(encoding="utf-8")))
