"""Every number of the reference implementations' oracles in shared/oracles, to 1e-6."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.metrics import (
    backfill_curve_reference,
    backfill_cutoffs,
    gldv2_inputs_from_padded,
    gldv2_map_at_k,
    leave_one_out_cmc,
    leave_one_out_map,
    mixed_gallery,
    pairwise_scores,
    revisitop_ground_truth,
    revisitop_map,
    tar_at_far,
)

# Copies of ../shared/oracles (inputs and outputs of the reference implementations), kept in the
# repository so that no checkout can skip these tests.
ORACLES = Path(__file__).resolve().parent / "oracles"
TOLERANCE = 1e-6


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(ORACLES / name) as data:
        return {key: data[key] for key in data.files}


def test_backfill_points_with_leave_one_out_metrics() -> None:
    d = _load("backfill_leave_one_out.npz")
    old, new, labels = d["old"], d["new"], d["labels"]
    cutoffs = backfill_cutoffs(len(old), int(d["steps"]))
    assert len(cutoffs) == len(d["top1"]) == int(d["steps"]) + 2
    for i, cutoff in enumerate(cutoffs):
        gallery = mixed_gallery(
            old.astype(np.float64), new.astype(np.float64), d["ordering"], int(cutoff)
        )
        scores = pairwise_scores(new.astype(np.float64), gallery, "euclidean")
        cmc = leave_one_out_cmc(scores, labels, (1, 5), no_positive="count-as-miss")
        assert cmc[1] == pytest.approx(d["top1"][i], abs=TOLERANCE)
        assert cmc[5] == pytest.approx(d["top5"][i], abs=TOLERANCE)
        assert leave_one_out_map(scores, labels) == pytest.approx(d["mAP"][i], abs=TOLERANCE)


def test_backfill_reference_curve_and_auc() -> None:
    d = _load("backfill_leave_one_out.npz")
    curve = backfill_curve_reference(
        d["old"], d["new"], d["labels"], d["ordering"], int(d["steps"])
    )
    for name in ("top1", "top5", "mAP"):
        np.testing.assert_allclose(curve[name], d[name], rtol=0, atol=TOLERANCE)
        assert curve[f"auc_{name}"] == pytest.approx(float(d[f"auc_{name}"]), abs=TOLERANCE)


def test_gldv2_map_at_100() -> None:
    d = _load("gldv2_map_at_100.npz")
    predictions, ground_truth = gldv2_inputs_from_padded(
        d["predictions"], d["ground_truth"], d["has_prediction"]
    )
    assert not all(d["has_prediction"]), "the oracle must exercise queries without predictions"
    assert gldv2_map_at_k(predictions, ground_truth, k=100) == pytest.approx(
        float(d["mAP_at_100"]), abs=TOLERANCE
    )


def test_gldv2_predictions_from_similarities_match_oracle_rows() -> None:
    d = _load("gldv2_map_at_100.npz")
    ranked = np.argsort(-d["sim"], axis=1, kind="stable")[:, :100]
    submitted = d["has_prediction"]
    np.testing.assert_array_equal(ranked[submitted], d["predictions"][submitted])


@pytest.mark.parametrize("protocol", ["easy", "medium", "hard"])
def test_revisitop_protocols(protocol: str) -> None:
    d = _load("revisitop_protocols.npz")
    expected = json.loads((ORACLES / "revisitop_protocols.json").read_text())
    nq = expected["num_queries"]
    easy = [d[f"q{i}_easy"] for i in range(nq)]
    hard = [d[f"q{i}_hard"] for i in range(nq)]
    junk = [d[f"q{i}_junk"] for i in range(nq)]
    np.testing.assert_array_equal(np.argsort(-d["sim"], axis=0, kind="stable"), d["ranks"])
    mean_ap, mp_at_k = revisitop_map(
        d["ranks"], revisitop_ground_truth(easy, hard, junk, protocol), expected["kappas"]
    )
    assert mean_ap == pytest.approx(expected["results"][protocol]["mAP"], abs=TOLERANCE)
    np.testing.assert_allclose(
        mp_at_k, expected["results"][protocol]["mP@k"], rtol=0, atol=TOLERANCE
    )


def test_tar_at_far() -> None:
    d = _load("tar_at_far.npz")
    np.testing.assert_allclose(
        tar_at_far(d["scores"], d["labels"], d["fars"]), d["tars"], rtol=0, atol=TOLERANCE
    )
