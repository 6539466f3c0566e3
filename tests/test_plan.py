"""``modelupgrade plan``: each option measured on a labelled sample, costed for a gallery size, and
the recommendation rule, on models built here whose spaces are known exactly.

The images carry their embeddings in their pixels: row 0 holds the old model's vector, row 1 the
new model's, so each TorchScript model (written with torch.jit directly, then adopted) reads its
row, and a test chooses how good each space is and how well one maps onto the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from modelupgrade.cli import main
from modelupgrade.commands.adopt import adopt
from modelupgrade.commands.plan import plan
from modelupgrade.evaluation import RetrievalEvaluator
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.models import embed, load_model
from modelupgrade.plan import (
    OptionMeasure,
    PlanMeasurements,
    plan_table,
)
from modelupgrade.registry.stage_log import StageRecord
from modelupgrade.training import train_model
from tests.data_fixtures import write_params_yaml
from tests.model_fixtures import resnet10t, toy_scenario_params

CLASSES, IMAGES, SIZE, DIM = 4, 240, 16, 8
COLUMNS = {
    "option",
    "kind",
    "description",
    "M",
    "delta_vs_old_pct",
    "of_new_new_pct",
    "gap_closed_pct",
    "negative_flip_rate",
    "images_to_embed",
    "vectors_to_transform",
    "backfill_seconds",
    "training_seconds",
    "one_time_seconds",
    "query_overhead_us",
    "backfill_auc",
    "note",
    "timing_spread",
    "head",
}
OPTIONS = [
    "keep-old",
    "reembed",
    "query/procrustes",
    "query/affine",
    "query/residual_mlp",
    "query/local_procrustes",
    "query/local_affine",
    "query/qdc",
    "query/slerp",
    "gallery/procrustes",
    "gallery/affine",
    "gallery/residual_mlp",
    "gallery/local_procrustes",
    "gallery/local_affine",
    "compatible",
]


class RowReader(nn.Module):
    """Embeds an image as its pixel row ``row`` read back to [-1, 1], turned by ``rotation``."""

    def __init__(self, row: int, rotation: torch.Tensor) -> None:
        super().__init__()
        self.row = row
        self.register_buffer("rotation", rotation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, 0, self.row, :DIM] * 2 - 1) @ self.rotation


def pixels(vectors: np.ndarray) -> np.ndarray:
    return np.round((np.clip(vectors, -1, 1) + 1) / 2 * 255).astype(np.uint8)


def write_models(root: Path, monkeypatch: Any, old_noise: float | None) -> dict[str, Any]:
    """Labelled images, the split file, and the two source networks: the new space is clean (class
    directions, a little noise) and rotated; the old space is the class directions plus
    ``old_noise`` of noise, or pure noise without class (None)."""
    rng = np.random.default_rng(0)
    labels = np.arange(IMAGES) % CLASSES
    centres = np.zeros((CLASSES, DIM))
    centres[np.arange(CLASSES), np.arange(CLASSES)] = 0.6
    new = centres[labels] + 0.03 * rng.normal(size=(IMAGES, DIM))
    if old_noise is None:
        old = rng.uniform(-0.6, 0.6, size=(IMAGES, DIM))
    else:
        old = centres[labels] + old_noise * rng.normal(size=(IMAGES, DIM))
    images = np.zeros((IMAGES, 1, SIZE, SIZE), dtype=np.uint8)
    images[:, 0, 0, :DIM], images[:, 0, 1, :DIM] = pixels(old), pixels(new)
    images[:, 0, 2:] = rng.integers(0, 256, size=(IMAGES, SIZE - 2, SIZE), dtype=np.uint8)
    tensor = torch.from_numpy(images)
    monkeypatch.setattr(
        "modelupgrade.data.load_images",
        lambda frame, dataset: tensor[torch.as_tensor(frame["index"].to_numpy().copy())],
    )
    sample = root / "sample.parquet"
    pd.DataFrame(
        {
            "item_id": [f"i{r}" for r in range(IMAGES)],
            "label": labels,
            "path": "x.idx",
            "index": np.arange(IMAGES),
        }
    ).to_parquet(sample)
    rotation = torch.linalg.qr(torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(1)))[0]
    sources = {}
    for name, row, turn in (("old", 0, torch.eye(DIM)), ("new", 1, rotation)):
        path = root / f"{name}.torchscript"
        torch.jit.save(torch.jit.trace(RowReader(row, turn), torch.zeros(2, 1, SIZE, SIZE)), path)
        preprocessing = {"input_size": SIZE, "channels": 1, "mean": [0.0], "std": [1.0]}
        sources[name] = {
            "kind": "torchscript",
            "options": {"path": str(path), "embedding_dim": DIM, "preprocessing": preprocessing},
        }
    params = toy_scenario_params(
        "tiny",
        resnet10t(embedding_dim=DIM),
        sources,
        {"epochs": 2, "batch_size": 32, "cpu_threads": 1},
    )
    for name in ("old", "new"):
        adopt(params, name, out=root / "models" / name)
    return {
        "params": params,
        "old": root / "models/old",
        "new": root / "models/new",
        "sample": sample,
        "images": tensor,
    }


@pytest.fixture
def recoverable(tmp_path, monkeypatch):
    """The old space holds the classes with noise; the new one is a clean rotation of them."""
    monkeypatch.chdir(tmp_path)
    return write_models(tmp_path, monkeypatch, old_noise=0.2)


def direct_scores(setup: dict[str, Any]) -> dict[str, Any]:
    """The evaluator's values computed here, on the held-out rows the plan says it scored."""
    params = setup["params"]
    frame = pd.read_parquet(setup["sample"])
    rows = np.sort(np.random.default_rng(params.seed).permutation(IMAGES)[IMAGES // 2 :])
    labels = frame["label"].to_numpy(np.int64)[rows]
    evaluator = RetrievalEvaluator(params.evaluation, labels, labels, True)
    images = setup["images"][torch.as_tensor(rows)]
    old = embed(load_model(setup["old"]), images)
    new = embed(load_model(setup["new"]), images)
    return {
        "keep-old": evaluator.evaluate(old, old),
        "reembed": evaluator.evaluate(new, new),
        "evaluator": evaluator,
    }


def test_the_plan_writes_every_option_with_the_evaluators_values_and_recommends_the_query_adapter(
    recoverable, monkeypatch
):
    records: list[StageRecord] = []
    monkeypatch.setattr(
        "modelupgrade.registry.stage_tracking._write", lambda record, *_: records.append(record)
    )
    result = plan(
        recoverable["params"],
        recoverable["old"],
        recoverable["new"],
        recoverable["sample"],
        gallery_size=10**9,
        out=Path("plan"),
        compatible_architecture="tiny",
    )
    table = result.plan
    written = pd.read_csv("plan/plan.csv")
    assert list(written["option"]) == OPTIONS and set(written.columns) == COLUMNS
    adapters = [name for name in OPTIONS if "/" in name]
    saved = {name.replace("/", "-") for name in adapters}
    assert {p.name for p in result.written} == {"plan.json", "plan.md", "plan.csv", *saved}
    assert f"**Recommended: {table.recommendation.option}.**" in Path("plan/plan.md").read_text()

    # Every M is the project's evaluator on the same vectors; flips are counted against old/old.
    direct = direct_scores(recoverable)
    old_correct = direct["keep-old"].correct
    for option in ("keep-old", "reembed"):
        row = table.row(option)
        assert row.M == pytest.approx(direct[option].metrics["mAP"], abs=1e-9)
        assert row.negative_flip_rate == pytest.approx(
            negative_flip_rate(old_correct, direct[option].correct)
        )
    assert table.row("keep-old").negative_flip_rate == 0.0

    # The spaces as built: the old one noisy, the new one clean; a rotation recovers nearly all of
    # the new quality from the new queries alone, with no backfill.
    m_old, m_new = table.row("keep-old").M, table.row("reembed").M
    assert m_new > 0.99 and m_old < 0.9
    query = table.row("query/procrustes")
    assert query.gap_closed_pct == pytest.approx((query.M - m_old) / (m_new - m_old) * 100)
    assert query.of_new_new_pct > 95 and query.images_to_embed == query.vectors_to_transform == 0
    # SLERP (α tuned on a support split) blends with the old model's query: its per-query cost
    # carries the old model's forward pass. The local adapters stand beside the global ones.
    slerp = table.row("query/slerp")
    assert "also runs the old model" in slerp.note
    assert slerp.query_overhead_us > query.query_overhead_us
    local = table.row("gallery/local_procrustes")
    assert local.head == "heads/gallery-local_procrustes" and local.vectors_to_transform == 10**9
    assert query.query_overhead_us > 0 and query.backfill_auc is None
    # A query adapter costs milliseconds of fitting, re-embedding 10⁹ images a good half hour
    # even for these tiny models: an adapter is recommended, the best-scoring one among those as
    # cheap (the rule's test below checks the choice among adapters).
    chosen = table.row(table.recommendation.option)
    assert chosen.kind in ("query-adapter", "gallery-adapter") and chosen.of_new_new_pct > 95
    assert table.row("reembed").one_time_seconds > 60 + chosen.one_time_seconds
    assert "within 5% of re-embedding" in table.recommendation.reason

    # Costs: the re-embedding backfill embeds every gallery image at the measured rate; a
    # gallery-side adapter transforms every stored vector; compatible training is estimated only.
    reembed, gallery = table.row("reembed"), table.row("gallery/procrustes")
    assert reembed.images_to_embed == 10**9 and reembed.backfill_seconds > 0
    assert gallery.vectors_to_transform == 10**9 and gallery.images_to_embed == 0
    assert reembed.backfill_auc is not None and gallery.backfill_auc is not None
    compatible = table.row("compatible")
    assert compatible.M is None and compatible.training_seconds > 0
    assert "not trained" in compatible.note and "images/s" in compatible.note
    doubled = plan_table(table.measurements, 2 * 10**9, 5.0)
    for name in OPTIONS:
        row, twice = table.row(name), doubled.row(name)
        assert twice.backfill_seconds == pytest.approx(2 * row.backfill_seconds)
        assert twice.images_to_embed == 2 * row.images_to_embed
        assert twice.vectors_to_transform == 2 * row.vectors_to_transform
        assert twice.training_seconds == row.training_seconds

    # The MLflow run of the plan carries the table and the recommendation.
    (record,) = records
    assert record.kind == "plan" and record.status == "FINISHED"
    assert record.tags["recommendation"] == table.recommendation.option
    assert record.metrics["reembed.M"] == pytest.approx(m_new)
    assert {Path(path).name for path, _ in record.artifacts} == {"plan.json", "plan.md", "plan.csv"}


def test_a_query_adapter_that_cannot_recover_the_new_quality_leaves_re_embedding_recommended(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    setup = write_models(tmp_path, monkeypatch, old_noise=None)
    table = plan(
        setup["params"],
        setup["old"],
        setup["new"],
        setup["sample"],
        gallery_size=50_000_000,
        out=Path("plan"),
        adapters=["procrustes_query", "procrustes"],
    ).plan
    # An old space without the classes: no map from it (or into it) brings them back.
    assert table.row("reembed").M > 0.99
    assert table.row("query/procrustes").of_new_new_pct < 80
    assert table.row("gallery/procrustes").of_new_new_pct < 80
    assert table.recommendation.option == "reembed"
    assert "Cheaper but below the bar: query/procrustes" in table.recommendation.reason
    # The new model is adopted: without an architecture its training time is not made up.
    compatible = table.row("compatible")
    assert compatible.M is None and compatible.training_seconds == 0
    assert "not measured" in compatible.note


def test_a_trained_compatible_model_is_scored_with_and_without_a_backfill(recoverable):
    params = recoverable["params"]
    frame = pd.read_parquet(recoverable["sample"])
    train_model(
        architecture=params.architectures["tiny"],
        architecture_name="tiny",
        training=params.training,
        images=recoverable["images"],
        labels=torch.from_numpy(frame["label"].to_numpy(np.int64, copy=True)),
        out_dir=Path("models/compatible"),
        generation=1,
        seed=params.seed,
        strategy_name="bct",
        strategy_params=params.strategies["bct"],
        old_model_dir=recoverable["old"],
        progress=False,
        item_ids=frame["item_id"].tolist(),
    )
    table = plan(
        params,
        recoverable["old"],
        recoverable["new"],
        recoverable["sample"],
        gallery_size=1000,
        out=Path("plan"),
        adapters=["procrustes_query"],
        compatible_model=Path("models/compatible"),
    ).plan
    direct = direct_scores(recoverable)
    rows = np.sort(np.random.default_rng(params.seed).permutation(IMAGES)[IMAGES // 2 :])
    images = recoverable["images"][torch.as_tensor(rows)]
    old = embed(load_model(recoverable["old"]), images)
    successor = embed(load_model("models/compatible"), images)
    evaluator = direct["evaluator"]
    cross = evaluator.evaluate(successor, old)
    assert table.row("compatible").M == pytest.approx(cross.metrics["mAP"], abs=1e-9)
    # Its flips are counted against the old system's answers, query by query.
    flips = negative_flip_rate(direct["keep-old"].correct, cross.correct)
    assert table.row("compatible").negative_flip_rate == pytest.approx(flips) and flips > 0
    both = table.row("compatible/backfill")
    assert both.M == pytest.approx(
        evaluator.evaluate(successor, successor).metrics["mAP"], abs=1e-9
    )
    assert both.images_to_embed == 1000 and both.backfill_auc is not None
    assert table.row("compatible").images_to_embed == 0
    # Already trained: its training time is shown, not counted again.
    assert both.training_seconds == table.row("compatible").training_seconds == 0
    assert "already trained, in" in both.note


def measured(**metric_of: float) -> PlanMeasurements:
    """Measurements with the given mAP per option and fixed unit costs: re-embedding 1 ms an
    image, a gallery adapter 1 µs a vector, a query adapter's fit 0.5 s."""
    kinds = {"keep-old": "keep", "reembed": "reembed", "query/procrustes": "query-adapter"}
    kinds["gallery/procrustes"] = "gallery-adapter"
    costs: dict[str, dict[str, Any]] = {
        "reembed": {"seconds_per_image": 1e-3},
        "query/procrustes": {"training_seconds": 0.5, "query_overhead_us": 2.0},
        "gallery/procrustes": {"seconds_per_vector": 1e-6, "training_seconds": 0.5},
    }
    options = [
        OptionMeasure(name, kinds[name], name, {"mAP": value}, 0.0, **costs.get(name, {}))
        for name, value in metric_of.items()
    ]
    return PlanMeasurements("mAP", options, "cpu", {"description": "test"}, {}, {})


def test_the_recommendation_rule_is_the_cheapest_option_within_the_tolerance_above_the_old_model():
    values = {"keep-old": 0.5, "reembed": 0.8, "query/procrustes": 0.77}
    values["gallery/procrustes"] = 0.79

    def pick(gallery_size: int, tolerance_pct: float, **changed: float) -> str:
        table = plan_table(measured(**{**values, **changed}), gallery_size, tolerance_pct)
        return table.recommendation.option

    # 10⁸ vectors: the gallery adapter's 100 s of transforms cost more than the query adapter's
    # 0.5 s fit, and 0.77 is within 5% of 0.8 (≥ 0.76).
    assert pick(10**8, 5.0) == "query/procrustes"
    # Within 2% the query adapter is out (< 0.784): the gallery adapter's 100 s beat 28 h.
    assert pick(10**8, 2.0) == "gallery/procrustes"
    assert pick(10**8, 0.0) == "reembed"
    # 10⁶ vectors: 1 s of transforms is as cheap as the fit (within a minute): the better M wins.
    assert pick(10**6, 5.0) == "gallery/procrustes"
    assert pick(10**6, 5.0, **{"query/procrustes": 0.795}) == "query/procrustes"
    # A new model no better than the old one: nothing is worth doing.
    no_better = {"reembed": 0.5, "query/procrustes": 0.49, "gallery/procrustes": 0.48}
    assert pick(10**6, 5.0, **no_better) == "keep-old"
    flat = plan_table(measured(**{**values, **no_better}), 10**6)
    assert "not worth its cost" in flat.recommendation.reason


def test_bad_input_is_one_error_line_with_exit_code_2(recoverable, capsys, tmp_path):
    params_file = write_params_yaml(tmp_path / "params.yaml", recoverable["params"])
    unlabelled = tmp_path / "unlabelled.parquet"
    pd.read_parquet(recoverable["sample"]).drop(columns="label").to_parquet(unlabelled)
    base = ["plan", "--params", str(params_file), "--out", str(tmp_path / "p")]
    cases = {
        "is not a model directory": ["--old", "nowhere", "--new", str(recoverable["new"])],
        "has no column(s) ['label']": ["--sample", str(unlabelled)],
        "--gallery-size must be a positive number": ["--gallery-size", "0"],
    }
    for message, changed in cases.items():
        given = {
            "--old": str(recoverable["old"]),
            "--new": str(recoverable["new"]),
            "--sample": str(recoverable["sample"]),
            "--gallery-size": "1000",
        }
        for flag, value in zip(changed[::2], changed[1::2], strict=True):
            given[flag] = value
        with pytest.raises(SystemExit) as stopped:
            main([*base, *(part for pair in given.items() for part in pair)])
        err = capsys.readouterr().err.strip().splitlines()
        # One error, and its hint on the line below.
        assert stopped.value.code == 2 and len(err) == 2, err
        assert err[0].startswith("error: ") and message in err[0], err
        assert err[1].startswith("  hint: "), err
    assert not (tmp_path / "p").exists()
