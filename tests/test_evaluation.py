"""Cross-model evaluation and the evaluate stage on tiny synthetic embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest

from modelupgrade.config import Params, parse_params
from modelupgrade.config.evaluation import EvaluationParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import RetrievalEvaluator, resolve_protocol
from modelupgrade.metrics import cmc_topk, mean_average_precision, pairwise_scores

if TYPE_CHECKING:
    from modelupgrade.layout import StudyLayout


def _clustered(
    n: int,
    dim: int,
    classes: int,
    rng: np.random.Generator,
    noise: float,
    centres: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    centres = rng.standard_normal((classes, dim)) if centres is None else centres
    labels = np.arange(n) % classes
    return (
        (centres[labels] + noise * rng.standard_normal((n, dim))).astype(np.float32),
        labels,
        centres,
    )


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_evaluator_faiss_topk_agrees_with_exact_ranking(leave_one_out: bool) -> None:
    rng = np.random.default_rng(0)
    gallery, gl, centres = _clustered(300, 16, 6, rng, 1.5)
    query, ql, _ = (
        (gallery, gl, None) if leave_one_out else _clustered(80, 16, 6, rng, 1.5, centres)
    )
    evaluator = RetrievalEvaluator(
        EvaluationParams(topk=[1, 5], map_at_k=10), ql, gl, leave_one_out
    )
    result = evaluator.evaluate(query, gallery)
    scores = pairwise_scores(query, gallery, "cosine")
    expected = cmc_topk(scores, ql, gl, (1, 5), leave_one_out=leave_one_out)
    assert result.metrics["top1"] == pytest.approx(expected[1])
    assert result.metrics["top5"] == pytest.approx(expected[5])
    assert result.metrics["mAP"] == pytest.approx(
        mean_average_precision(scores, ql, gl, leave_one_out=leave_one_out)
    )
    assert 0.0 <= result.metrics["mAP@10"] <= 1.0
    assert result.correct.shape == (len(query),)


def test_resolve_protocol() -> None:
    ids = np.array(["a", "b"])
    assert resolve_protocol("auto", ids, ids) is True
    assert resolve_protocol("auto", ids, np.array(["c"])) is False
    with pytest.raises(UserError, match="share"):
        resolve_protocol("auto", ids, np.array(["a", "c"]))
    with pytest.raises(UserError, match="retrieve themselves"):
        resolve_protocol("query-gallery", ids, ids)


def _write_scenario(root: Path) -> None:
    rng = np.random.default_rng(1)
    classes, dim = 5, 12
    centres_old = rng.standard_normal((classes, dim))
    centres_new = rng.standard_normal((classes, dim))
    for split, n in (("query", 40), ("gallery", 150)):
        labels = np.arange(n) % classes
        frame = pd.DataFrame({"item_id": [f"{split}{i}" for i in range(n)], "label": labels})
        (root / "data/splits/sc").mkdir(parents=True, exist_ok=True)
        frame.to_parquet(root / f"data/splits/sc/{split}.parquet")
        spaces = {
            "gen0": (centres_old, 1.2),
            "gen1-independent": (centres_new, 0.8),
            "gen1-bct": (centres_old, 0.9),
        }
        for model, (centres, noise) in spaces.items():
            out = root / "embeddings/sc" / model
            out.mkdir(parents=True, exist_ok=True)
            np.save(
                out / f"{split}.npy",
                (centres[labels] + noise * rng.standard_normal((n, dim))).astype(np.float32),
            )


def test_evaluate_stage_writes_matrix_summary_and_heatmap(tmp_path: Path) -> None:
    from modelupgrade.heads import build_head, save_head
    from stages.evaluate import main

    _write_scenario(tmp_path)
    save_head(build_head("fct", 12, 12, 16, 2), tmp_path / "heads/sc/fct-bct", name="fct")
    save_head(build_head("rqt", 12, 12, 16, 2), tmp_path / "heads/sc/rqt-bct", name="rqt")
    save_head(build_head("fct", 12, 12, 16, 2), tmp_path / "heads/sc/fct-independent", name="fct")
    params = parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": ["independent", "bct"]}},
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
            "sequential": {"strategies": []},
            "evaluation": {"map_at_k": 20},
        }
    )
    import yaml

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    r = lambda p: str(tmp_path / p)
    main(
        [
            "--params",
            r("params.yaml"),
            "--scenario",
            "sc",
            "--root",
            str(tmp_path),
        ]
    )
    table = pd.read_parquet(tmp_path / "metrics/sc/cross_model.parquet")
    assert list(table.columns) == ["query_set", "gallery_set", "metric", "value"]
    assert {"fct-bct(gen0)"} <= set(table.gallery_set)
    assert {"rqt-bct(gen1-bct)"} <= set(table.query_set)
    assert {"mAP", "top1", "top5", "mAP@20", "negative_flip_rate"} <= set(table.metric)
    assert (tmp_path / "metrics/sc/cross_model.csv").is_file()
    assert (tmp_path / "plots/sc/cross_model_heatmap.png").stat().st_size > 1000
    import json

    summary = json.loads((tmp_path / "metrics/sc/summary.json").read_text())
    rows = {row["comparison"]: row for row in summary["strategies"]["bct"]}
    assert set(rows) == {"self", "backward", "forward-head", "reverse-head"}
    old_self = summary["old_self"]
    backward = rows["backward"]
    assert backward["delta_up_pct"] == pytest.approx(
        (backward["value"] - old_self) / old_self * 100
    )
    oracle_self = summary["oracle_self"]
    assert rows["self"]["delta_down_pct"] == pytest.approx(
        (oracle_self - rows["self"]["value"]) / oracle_self * 100
    )
    assert 0.0 <= backward["negative_flip_rate"] <= 1.0
    # Backward is the new model's queries against the old model's gallery, not the other way
    # round: computed here directly from the files (cosine, full-ranking mAP).
    from modelupgrade.backfill import evaluate_state

    def vectors(model: str, split: str) -> np.ndarray:
        return np.load(tmp_path / f"embeddings/sc/{model}/{split}.npy")

    def labels(split: str) -> np.ndarray:
        return pd.read_parquet(tmp_path / f"data/splits/sc/{split}.parquet").label.to_numpy()

    def direct_map(query_model: str, gallery_model: str) -> float:
        state = evaluate_state(
            vectors(query_model, "query"),
            vectors(gallery_model, "gallery"),
            labels("gallery"),
            False,
            "cosine",
            query_labels=labels("query"),
        )
        return float(state.mAP[0])

    assert backward["value"] == pytest.approx(direct_map("gen1-bct", "gen0"), abs=1e-6)
    assert backward["value"] != pytest.approx(direct_map("gen0", "gen1-bct"), abs=1e-3)
    assert old_self == pytest.approx(direct_map("gen0", "gen0"), abs=1e-6)
    # The oracle is summarised only because a head pairs with it; its own Δ↓ is zero.
    oracle_rows = {row["comparison"]: row for row in summary["strategies"]["independent"]}
    assert oracle_rows["forward-head"]["gallery_set"] == "fct-independent(gen0)"
    assert oracle_rows["self"]["delta_down_pct"] == pytest.approx(0.0)
    # The registry's gates read Δ↓ from one place: the summary's map, the same numbers.
    assert summary["delta_down_pct"] == pytest.approx(
        {"gen1-bct": rows["self"]["delta_down_pct"], "gen1-independent": 0.0}
    )


def test_evaluate_stage_missing_embeddings_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from stages.evaluate import main

    _write_scenario(tmp_path)
    (tmp_path / "embeddings/sc/gen1-bct/query.npy").unlink()
    (tmp_path / "params.yaml").write_text(
        "scenarios: {sc: {kind: extended-data, strategies: [independent, bct]}}\n"
        "architectures: {default: {}}\n"
        "strategies: {independent: {kind: independent}, bct: {kind: bct}}\n"
        "sequential: {strategies: []}\n"
    )
    with pytest.raises(SystemExit):
        main(
            [
                "--params",
                str(tmp_path / "params.yaml"),
                "--scenario",
                "sc",
                "--root",
                str(tmp_path),
            ]
        )
    assert "run the embed stage first" in capsys.readouterr().err


def _write_sequential_study(
    root: Path,
    rng: np.random.Generator,
    spaces: dict[str, float],
    gallery_only: dict[str, float] | None = None,
) -> None:
    """Query and gallery splits of five classes under ``root``/data/splits/sequential, and each
    model's embeddings of them under embeddings/sequential/<model>: the class centres plus noise
    of the model's scale (``spaces``; ``gallery_only``: models that embed the gallery alone)."""
    classes, dim = 5, 12
    centres = rng.standard_normal((classes, dim))
    gallery_only = gallery_only or {}
    for split, n in (("query", 40), ("gallery", 150)):
        labels = np.arange(n) % classes
        frame = pd.DataFrame({"item_id": [f"{split}{i}" for i in range(n)], "label": labels})
        (root / "data/splits/sequential").mkdir(parents=True, exist_ok=True)
        frame.to_parquet(root / f"data/splits/sequential/{split}.parquet")
        for model, noise in {
            **spaces,
            **(gallery_only or {} if split == "gallery" else {}),
        }.items():
            out = root / "embeddings/sequential" / model
            out.mkdir(parents=True, exist_ok=True)
            vectors = centres[labels] + noise * rng.standard_normal((n, dim))
            np.save(out / f"{split}.npy", vectors.astype(np.float32))


def _evaluate_sequential(root: Path, params: Params, **options: Any) -> StudyLayout:
    """The sequential evaluation of the study ``_write_sequential_study`` wrote under ``root``, in
    the study's own layout there (returned)."""
    from modelupgrade.commands.evaluation import evaluate
    from modelupgrade.layout import StudyLayout

    layout = StudyLayout(root)
    evaluate(params, "sequential", root=root, **options)
    return layout


def _map(table: pd.DataFrame, query: str, gallery: str) -> float:
    """The mAP of ``query``'s queries on ``gallery``'s gallery in a cross-model table."""
    row = table[
        (table.query_set == query) & (table.gallery_set == gallery) & (table.metric == "mAP")
    ]
    return float(row.value.iloc[0])


def test_sequential_chains_get_delta_down_against_the_oracle_chain_which_the_gates_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one path of Δ↓: the evaluation writes it into each chain's summary, the registry's
    gate evidence reads it from there (and nowhere else) under the chain's model keys."""
    from modelupgrade.registry.sources import load_evidence

    monkeypatch.chdir(tmp_path)
    spaces = {"gen0": 1.4, "bct/gen1": 1.1, "independent/gen1": 0.7, "bct/gen2": 0.9}
    _write_sequential_study(tmp_path, np.random.default_rng(2), spaces)
    params = parse_params(
        {
            "scenarios": {},
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
            "sequential": {"strategies": ["bct"], "fractions": [0.25, 0.5, 1.0]},
        }
    )
    # Two generations of three planned: bct/gen2 exists but is not part of this evaluation.
    layout = _evaluate_sequential(
        tmp_path, params, strategies=["bct", "independent"], generations=2
    )
    import json

    summary = json.loads((tmp_path / "metrics/sequential/bct/summary.json").read_text())
    assert summary["compatibility"]["mAP"]["generations"] == ["gen0", "gen1"]
    table = pd.read_parquet(tmp_path / "metrics/sequential/bct/cross_model.parquet")
    oracle = pd.read_parquet(tmp_path / "metrics/sequential/independent/cross_model.parquet")
    ours, theirs = _map(table, "gen1", "gen1"), _map(oracle, "gen1", "gen1")
    assert summary["oracle"] == "independent"
    # gen0 is shared by both chains: no degradation.
    assert summary["delta_down_pct"] == pytest.approx(
        {"gen0": 0.0, "gen1": (theirs - ours) / theirs * 100}
    )
    evidence = load_evidence(
        params, "sequential", layout.metrics("sequential"), None, True, ["bct"]
    )
    assert evidence.degradation_pct == pytest.approx(
        {"gen0": 0.0, "bct/gen1": summary["delta_down_pct"]["gen1"]}
    )


def test_a_two_model_scenario_has_no_generations_to_count() -> None:
    from modelupgrade.evaluation.scenario import evaluate_scenario

    params = parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": ["bct"]}},
            "architectures": {"default": {}},
            "strategies": {"bct": {"kind": "bct"}},
            "sequential": {"strategies": ["bct"]},
        }
    )
    with pytest.raises(UserError, match="two-model scenario"):
        evaluate_scenario(params, "sc", generations=2)


def test_a_chain_with_a_forward_head_is_evaluated_on_the_gallery_each_generation_refreshed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BiCT's sequential reading (Table 6): generation i's queries on the gallery the chain held
    when it went live (F_{i−1}, M_BCT), then on the gallery its ψ_i refreshed (F_i, M_FCT); a
    chain without heads keeps gen0's gallery."""
    monkeypatch.chdir(tmp_path)
    # The refreshed galleries are the cleanest: searching them must score highest.
    spaces = {"gen0": 1.6, "bict/gen1": 1.0, "bict/gen2": 0.9, "bct/gen1": 1.0, "bct/gen2": 0.9}
    refreshed = {"bict/gen1-psi": 0.3, "bict/gen2-psi": 0.2}
    _write_sequential_study(tmp_path, np.random.default_rng(4), spaces, gallery_only=refreshed)
    params = parse_params(
        {
            "scenarios": {},
            "architectures": {"default": {}},
            "strategies": {"bct": {"kind": "bct"}, "bict": {"kind": "regression"}},
            "heads": {"bict_momentum": {"kind": "bict", "input_momentum": 0.5}},
            "sequential": {"strategies": ["bct", "bict"], "heads": {"bict": "bict_momentum"}},
        }
    )
    _evaluate_sequential(tmp_path, params)
    import json

    def value(strategy: str, query: str, gallery: str) -> float:
        table = pd.read_parquet(tmp_path / f"metrics/sequential/{strategy}/cross_model.parquet")
        return _map(table, query, gallery)

    bict = json.loads((tmp_path / "metrics/sequential/bict/summary.json").read_text())
    steps = bict["refreshes"]["mAP"]
    assert [(s["current_gallery"], s["refreshed_gallery"]) for s in steps] == [
        ("gen0", "gen1-psi"),
        ("gen1-psi", "gen2-psi"),
    ]
    assert steps[1]["on_current"] == value("bict", "gen2", "gen1-psi")
    assert steps[1]["on_refreshed"] == value("bict", "gen2", "gen2-psi")
    assert steps[1]["on_refreshed"] > steps[1]["on_current"] > value("bict", "gen2", "gen0")
    bct = json.loads((tmp_path / "metrics/sequential/bct/summary.json").read_text())
    assert [(s["current_gallery"], s["refreshed_gallery"]) for s in bct["refreshes"]["mAP"]] == [
        ("gen0", None),
        ("gen0", None),
    ]
    assert bct["refreshes"]["mAP"][1]["on_current"] == value("bct", "gen2", "gen0")
