"""AUCs, Seo et al.'s conditions, the serving arrays of the simulator and the
simulate_backfill stage.

The ordering policies and serving modes themselves are tested in tests/test_ordering_serving.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from modelupgrade.backfill import (
    ServingArrays,
    auc_mean,
    auc_trapezoid,
    check_conditions,
    evaluate_state,
    simulate_curve,
)
from modelupgrade.backfill.summary import BackfillSummary
from modelupgrade.config import parse_params
from modelupgrade.errors import UserError
from modelupgrade.serving import build_serving_mode


def serving_arrays(rng, nq=12, n=30, d=5):
    def r(m):
        return rng.normal(size=(m, d)).astype(np.float32)

    return ServingArrays(
        old_query=r(nq),
        new_query=r(nq),
        old_gallery=r(n),
        new_gallery=r(n),
        forward_gallery=r(n),
        reverse_query=r(nq),
        rho_query=r(nq),
        rho_gallery=r(n),
        rho_reverse_query=r(nq),
    )


def systems_of(mode, arrays):
    return arrays.systems(build_serving_mode(mode).plan(arrays.forms()))


def test_each_serving_mode_reads_the_documented_simulator_arrays():
    a = serving_arrays(np.random.default_rng(0))
    mixed = systems_of("mixed", a)
    assert mixed.query_old_side is a.new_query and mixed.gallery_old_side is a.forward_gallery
    assert mixed.query_new_side is a.new_query and mixed.gallery_new_side is a.new_gallery
    no_head = systems_of(
        "mixed",
        ServingArrays(new_query=a.new_query, new_gallery=a.new_gallery, old_gallery=a.old_gallery),
    )
    assert no_head.gallery_old_side is a.old_gallery
    merge = systems_of("rank-merge", a)
    assert merge.query_old_side is a.old_query and merge.gallery_old_side is a.old_gallery
    assert merge.query_new_side is a.new_query and merge.gallery_new_side is a.new_gallery
    rqt = systems_of("rank-merge-rqt", a)
    assert rqt.query_old_side is a.reverse_query and rqt.gallery_old_side is a.old_gallery
    full = systems_of("rank-merge-full", a)
    assert (
        full.query_old_side is a.rho_reverse_query
        and full.query_new_side is a.rho_query
        and full.gallery_new_side is a.rho_gallery
        and full.gallery_old_side is a.old_gallery
    )
    with pytest.raises(UserError, match="rank-merge-full"):
        systems_of(
            "rank-merge-full", ServingArrays(new_query=a.new_query, new_gallery=a.new_gallery)
        )


def test_rank_merge_end_points_are_old_old_and_new_new():
    rng = np.random.default_rng(2)
    a = serving_arrays(rng, nq=30, n=30)
    labels = rng.integers(0, 4, 30)
    curve = simulate_curve(
        a.old_gallery,
        a.new_gallery,
        a.new_query,
        labels,
        rng.permutation(30),
        steps=[0, 0.5, 1],
        old_side_query=a.old_query,
        distance="cosine",
    )
    old_old = evaluate_state(a.old_query, a.old_gallery, labels, distance="cosine")
    new_new = evaluate_state(a.new_query, a.new_gallery, labels, distance="cosine")
    assert curve.mAP[0] == pytest.approx(old_old.mAP[0], abs=1e-7)
    assert curve.mAP[-1] == pytest.approx(new_new.mAP[0], abs=1e-7)
    assert curve.top1[0] == pytest.approx(old_old.top1[0]) and curve.top1[-1] == pytest.approx(
        new_new.top1[0]
    )


def test_auc_rules():
    t = np.linspace(0, 1, 5)
    values = np.array([0.2, 0.4, 0.5, 0.6, 1.0])
    assert auc_mean(values) == pytest.approx(0.54)
    assert auc_trapezoid(t, values) == pytest.approx(0.25 * (0.1 + 0.4 + 0.5 + 0.6 + 0.5))


def test_conditions_checker():
    ok = check_conditions(np.array([0.5, 0.6, 0.6, 0.8]), old_old=0.5, new_new=0.8)
    assert ok.all_met and ok.largest_drop == 0.0
    dip = check_conditions(np.array([0.5, 0.7, 0.65, 0.8]), old_old=0.4, new_new=0.8)
    assert not dip.monotone and dip.largest_drop == pytest.approx(0.05) and not dip.all_met
    low = check_conditions(np.array([0.3, 0.5, 0.7]), old_old=0.4, new_new=0.75)
    assert not low.starts_at_or_above_old and not low.ends_at_or_above_new and low.monotone


def test_stage_writes_curves_summary_plot_and_dvc_csvs(tmp_path, monkeypatch):
    from modelupgrade.commands.backfill import simulate_backfill

    rng = np.random.default_rng(4)
    monkeypatch.chdir(tmp_path)
    n, nq, d = 60, 20, 6
    splits = tmp_path / "data/splits/sc"
    splits.mkdir(parents=True)
    g_labels, q_labels = rng.integers(0, 4, n), rng.integers(0, 4, nq)
    pd.DataFrame({"item_id": [f"g{i}" for i in range(n)], "label": g_labels}).to_parquet(
        splits / "gallery.parquet"
    )
    pd.DataFrame({"item_id": [f"q{i}" for i in range(nq)], "label": q_labels}).to_parquet(
        splits / "query.parquet"
    )

    def emb(name, **extra):
        folder = tmp_path / "embeddings/sc" / name
        folder.mkdir(parents=True)
        np.save(folder / "query.npy", rng.normal(size=(nq, d)).astype(np.float32))
        np.save(folder / "gallery.npy", rng.normal(size=(n, d)).astype(np.float32))
        return str(folder)

    old, new = emb("gen0"), emb("gen1-independent")
    np.save(tmp_path / "sigma2.npy", rng.random(n).astype(np.float32))
    np.save(tmp_path / "forward.npy", rng.normal(size=(n, d)).astype(np.float32))
    np.save(tmp_path / "logits.npy", rng.normal(size=(n, 4)).astype(np.float32))
    params = parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": []}},
            "architectures": {"default": {}},
            "strategies": {},
            "sequential": {"strategies": []},
            "backfill": {
                "points": 5,
                "policies": ["random", "fastfill-uncertainty", "old-confidence", "oracle"],
                "serving_modes": ["mixed", "rank-merge", "rank-merge-rqt"],
            },
        }
    )
    summary = simulate_backfill(
        params,
        "sc",
        old=Path(old),
        variant=[f"bct={new}", f"fastfill={new}", f"independent={new}"],
        array=[
            f"fastfill:forward_gallery={tmp_path / 'forward.npy'}",
            f"fastfill:sigma2={tmp_path / 'sigma2.npy'}",
        ],
        old_logits=tmp_path / "logits.npy",
        compatible=["bct"],
    ).summary
    tidy = pd.read_parquet(tmp_path / "metrics/sc/backfill_curves.parquet")
    assert {"strategy", "policy", "mode", "t", "top1", "top5", "mAP", "nfr"} <= set(tidy.columns)
    combos = set(map(tuple, tidy[["strategy", "policy", "mode"]].drop_duplicates().to_numpy()))
    assert ("fastfill", "fastfill-uncertainty", "mixed") in combos
    assert ("bct", "fastfill-uncertainty", "mixed") not in combos  # bct has no σ²
    assert not any(mode == "rank-merge-rqt" for *_, mode in combos)  # no reverse head given
    assert all(c.endpoints_match for c in summary.curves)
    oracle = [c for c in summary.curves if c.policy == "oracle"]
    assert oracle and not any(c.deployable for c in oracle)
    # Its score is the mixed index's served error: it orders no rank-merge backfill.
    assert {c.mode for c in oracle} == {"mixed"}
    # It needs old-state vectors in the new space: BCT's own (trained compatible) or ψ(old); an
    # independent model's raw old vectors live in an unrelated space.
    assert {c.strategy for c in oracle} == {"bct", "fastfill"}
    assert any(
        (s["strategy"], s["policy"]) == ("independent", "oracle") and "new space" in s["reason"]
        for s in summary.skipped
    )
    written = json.loads((tmp_path / "metrics/sc/backfill_summary.json").read_text())
    assert written["curves"][0]["auc_trapezoid"]["mAP"] == pytest.approx(
        summary.curves[0].auc_trapezoid["mAP"]
    )
    assert BackfillSummary.read(tmp_path / "metrics/sc/backfill_summary.json") == summary
    assert (tmp_path / "plots/sc/backfill_curves.png").stat().st_size > 1000
    assert len(list((tmp_path / "metrics/sc/backfill_plots").glob("*.csv"))) == len(combos)
    # A random order is one draw: its curve is the mean over backfill.random_permutations seeds
    # (FastFill averages 5); a scored order is one order.
    from modelupgrade.backfill import backfill_curve, uniform_grid
    from modelupgrade.ordering import build_ordering

    arrays = ServingArrays(
        old_query=np.load(Path(old) / "query.npy"),
        new_query=np.load(Path(new) / "query.npy"),
        old_gallery=np.load(Path(old) / "gallery.npy"),
        new_gallery=np.load(Path(new) / "gallery.npy"),
    )
    grid = uniform_grid(5, n)
    seeded = [
        backfill_curve(
            systems_of("mixed", arrays),
            q_labels,
            g_labels,
            build_ordering("random").order(n, seed=params.seed + draw),
            grid.cutoffs,
            grid.t,
            distance=params.backfill.distance,
            topk=(1, 5),
        )
        for draw in range(params.backfill.random_permutations)
    ]
    drawn = tidy[(tidy["strategy"] == "independent") & (tidy["mode"] == "mixed")]
    random_rows = drawn[drawn["policy"] == "random"]
    assert len(random_rows) == 5 and (random_rows["permutations"] == 5).all()
    assert (drawn[drawn["policy"] == "old-confidence"]["permutations"] == 1).all()
    for metric in ("top1", "mAP"):
        draws = np.stack([getattr(curve, metric) for curve in seeded])
        assert random_rows[metric].to_numpy() == pytest.approx(draws.mean(axis=0), abs=1e-12)
        assert not np.allclose(draws[0], draws.mean(axis=0))  # the draws do differ
    assert {c.permutations for c in summary.curves if c.policy == "random"} == {5}
    # Naive rank merge starts at old/old.
    merge = next(c for c in summary.curves if c.mode == "rank-merge")
    assert merge.start["mAP"] == pytest.approx(summary.old_old["mAP"], abs=1e-9)
    # The curve's end points against the evaluator's own search (FAISS and the full-ranking mAP),
    # not against the curve engine: t = 0 is old/old, t = 1 the new model on its new gallery.
    from modelupgrade.evaluation import RetrievalEvaluator

    evaluator = RetrievalEvaluator(params.evaluation, q_labels, g_labels, leave_one_out=False)

    def evaluated(model: str) -> dict[str, float]:
        folder = tmp_path / "embeddings/sc" / model
        query, gallery = np.load(folder / "query.npy"), np.load(folder / "gallery.npy")
        return evaluator.evaluate(query, gallery).metrics

    mixed = next(c for c in summary.curves if (c.strategy, c.mode) == ("bct", "mixed"))
    for metric in ("top1", "mAP"):
        assert summary.old_old[metric] == pytest.approx(evaluated("gen0")[metric], abs=1e-6)
        assert mixed.end[metric] == pytest.approx(evaluated("gen1-independent")[metric], abs=1e-6)


def test_stage_cli_reports_bad_input(tmp_path, capsys):
    from modelupgrade.backfill.study import parse_pairs
    from stages import simulate_backfill

    with pytest.raises(SystemExit):
        simulate_backfill.main(
            ["--params", str(tmp_path / "missing.yaml"), "--scenario", "x", "--old", "y"]
        )
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(UserError, match="NAME=VALUE"):
        parse_pairs(["bct"], "variant")


def _clustered(rng, labels, d, noise):
    centres = rng.normal(size=(labels.max() + 1, d))
    return (centres[labels] + noise * rng.normal(size=(len(labels), d))).astype(np.float32)


def _study_inputs(tmp_path, rng, query_is_gallery):
    n, nq, d = 80, 30, 8
    labels = rng.integers(0, 4, n)
    splits = tmp_path / "data/splits/sc"
    splits.mkdir(parents=True)
    gallery = pd.DataFrame({"item_id": [f"g{i}" for i in range(n)], "label": labels})
    gallery.to_parquet(splits / "gallery.parquet")
    query = (
        gallery if query_is_gallery else gallery.iloc[:nq].assign(item_id=lambda f: "q" + f.item_id)
    )
    query.to_parquet(splits / "query.parquet")
    q_labels = query.label.to_numpy()

    def emb(name, gallery_vectors, query_vectors):
        folder = tmp_path / "embeddings/sc" / name
        folder.mkdir(parents=True)
        np.save(folder / "gallery.npy", gallery_vectors)
        np.save(folder / "query.npy", query_vectors)
        return folder

    return labels, q_labels, d, emb


def _params(policies=("random",), modes=("mixed",)):
    return parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": []}},
            "architectures": {"default": {}},
            "strategies": {},
            "sequential": {"strategies": []},
            "backfill": {"points": 5, "policies": list(policies), "serving_modes": list(modes)},
        }
    )


def test_auto_protocol_on_identical_splits_keeps_each_query_from_retrieving_itself(
    tmp_path, monkeypatch
):
    """The split stage's leave-one-out writes the same rows to query.parquet and gallery.parquet;
    evaluation.protocol ``auto`` must then exclude each query's own row, as the evaluator does."""
    from modelupgrade.commands.backfill import simulate_backfill

    rng = np.random.default_rng(7)
    monkeypatch.chdir(tmp_path)
    labels, _, d, emb = _study_inputs(tmp_path, rng, query_is_gallery=True)
    noise = rng.normal(size=(len(labels), d)).astype(np.float32)
    old = emb("gen0", noise, noise)
    new = emb("gen1-independent", noise, noise)
    summary = simulate_backfill(_params(), "sc", old=old, variant=[f"independent={new}"]).summary
    assert summary.protocol == "leave-one-out"
    expected = evaluate_state(noise, noise, labels, True, "cosine")
    assert summary.old_old["top1"] == pytest.approx(float(expected.top1[0]))
    # With its own row searchable every query would find itself first.
    assert summary.old_old["top1"] < 0.9


def test_seo_end_condition_compares_with_the_independently_trained_new_model(tmp_path, monkeypatch):
    """Eq. 7: the fully backfilled system must reach M(new, new) of the independent new model; a
    system compared with its own new model passes by construction, a pure-noise one included."""
    from modelupgrade.commands.backfill import simulate_backfill

    rng = np.random.default_rng(8)
    monkeypatch.chdir(tmp_path)
    labels, q_labels, d, emb = _study_inputs(tmp_path, rng, query_is_gallery=False)
    old = emb("gen0", _clustered(rng, labels, d, 1.0), _clustered(rng, q_labels, d, 1.0))
    good_g, good_q = _clustered(rng, labels, d, 0.1), _clustered(rng, q_labels, d, 0.1)
    independent = emb("gen1-independent", good_g, good_q)
    noise = emb(
        "gen1-noise",
        rng.normal(size=(len(labels), d)).astype(np.float32),
        rng.normal(size=(len(q_labels), d)).astype(np.float32),
    )
    summary = simulate_backfill(
        _params(modes=("mixed", "rank-merge")),
        "sc",
        old=old,
        variant=[f"independent={independent}", f"noise={noise}"],
    ).summary
    assert summary.reference_system == "independent"
    assert summary.reference_new_new["mAP"] == pytest.approx(
        float(evaluate_state(good_q, good_g, labels, False, "cosine", query_labels=q_labels).mAP[0])
    )
    for curve in summary.curves:
        ends = curve.conditions["mAP"].ends_at_or_above_new
        assert ends is (curve.strategy == "independent"), (curve.strategy, curve.mode)


def test_study_layout_marks_compatible_systems_for_the_oracle(tmp_path):
    """BCT-family strategies (and the heads on them) serve old vectors that are meant to be
    compared with the new ones; an independent model's are not, heads on it included."""
    from modelupgrade.backfill.study import backfill_inputs
    from modelupgrade.backfill.variants import scenario_variants
    from modelupgrade.layout import StudyLayout

    params = parse_params(
        {
            "scenarios": {
                "sc": {
                    "kind": "extended-data",
                    "strategies": ["independent", "bct"],
                    "heads": {"fct": "independent", "fct_bct": "bct"},
                }
            },
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
            "heads": {"fct": {"kind": "fct"}, "fct_bct": {"kind": "fct"}},
            "sequential": {"strategies": []},
        }
    )
    found = scenario_variants(params, "sc", StudyLayout(embeddings_root=tmp_path))
    assert set(found.variants) == {"independent", "bct", "fct-independent", "fct_bct-bct"}
    assert found.compatible == {"bct", "fct_bct-bct"}
    with pytest.raises(UserError, match="no --variant defines"):
        backfill_inputs(params, "sc", old=tmp_path, variant_items=["a=x"], compatible=["b"])
