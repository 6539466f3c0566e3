"""The adapters a team would pick today: Local Drift-Adapters (per-cluster Procrustes and affine
maps blended by a soft router) and query drift compensation, each checked against what it can
represent exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modelupgrade.config.heads import HeadParams
from modelupgrade.errors import UserError
from modelupgrade.heads import EmbeddingPairs, apply, build_head, fit_head, head_dims
from modelupgrade.heads.local import spherical_kmeans
from modelupgrade.heads.training import resolve_training
from tests.test_heads_training_free import random_orthogonal


def fitted(kind: str, old: np.ndarray, new: np.ndarray, **options: object):
    entry = HeadParams(kind=kind, options=dict(options))
    training = resolve_training(entry)
    in_dim, out_dim = head_dims(kind, old.shape[1], new.shape[1])
    head = build_head(kind, in_dim, out_dim, training.hidden_dim, training.depth, entry.options)
    fit_head(head, EmbeddingPairs(old, new, np.zeros(len(old), np.int64)), training, seed=0)
    return head


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def two_regions(rng: np.random.Generator, n: int, d_old: int, d_new: int):
    """Old vectors in two well-separated cones, each mapped into the new space by its own
    (semi-)orthogonal map: no single map fits both, one per region does."""
    axis = np.zeros(d_old)
    axis[0] = 3.0
    side = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    old = side[:, None] * axis + rng.standard_normal((n, d_old))
    old /= np.linalg.norm(old, axis=1, keepdims=True)
    maps = [random_orthogonal(d_old, d_new, rng) for _ in range(2)]
    new = np.where((side > 0)[:, None], old @ maps[0], old @ maps[1])
    return old.astype(np.float32), new.astype(np.float32)


@pytest.mark.parametrize("kind", ["local_procrustes", "local_affine"])
def test_a_local_adapter_recovers_a_map_per_region_that_no_global_one_can(kind: str) -> None:
    rng = np.random.default_rng(0)
    old, new = two_regions(rng, 1200, 12, 16)
    fit, held = slice(0, 800), slice(800, None)
    global_kind = kind.removeprefix("local_")
    local = fitted(kind, old[fit], new[fit], clusters=2, temperature=0.02)
    single = fitted(global_kind, old[fit], new[fit])
    local_cos = mean_cosine(apply(local, old[held]), new[held])
    global_cos = mean_cosine(apply(single, old[held]), new[held])
    assert local_cos > 0.99 and global_cos < 0.9


def test_one_cluster_is_the_global_map_and_the_router_blends_softly() -> None:
    rng = np.random.default_rng(1)
    old, new = two_regions(rng, 600, 8, 8)
    one = fitted("local_procrustes_query", old, new, clusters=1)
    single = fitted("procrustes_query", old, new)
    np.testing.assert_allclose(apply(one, new), apply(single, new), atol=1e-5)
    soft = fitted("local_procrustes", old, new, clusters=4, temperature=0.1)
    route = soft.psi.routing(torch.from_numpy(old))
    torch.testing.assert_close(route.sum(1), torch.ones(len(old)))
    assert 0.25 < float(route.max(1).values.mean()) < 1.0


def test_a_cluster_too_small_takes_the_global_map() -> None:
    rng = np.random.default_rng(2)
    old, new = two_regions(rng, 100, 6, 6)
    head = fitted("local_procrustes", old, new, clusters=2, min_pairs=1000)
    single = fitted("procrustes", old, new)
    for k in range(2):
        torch.testing.assert_close(head.psi.weights[k], single.psi.weight_t)


def test_spherical_kmeans_is_seeded_and_separates_opposite_cones() -> None:
    rng = np.random.default_rng(3)
    old, _ = two_regions(rng, 400, 10, 10)
    points = torch.from_numpy(old)
    centroids, assignment = spherical_kmeans(points, 2, 50, seed=7)
    again, same = spherical_kmeans(points, 2, 50, seed=7)
    torch.testing.assert_close(centroids, again)
    torch.testing.assert_close(assignment, same)
    side = torch.from_numpy(np.arange(400) % 2 == 0)
    agree = (assignment == assignment[0]) == side
    assert bool(agree.all()) or bool((~agree).all())


def test_query_drift_compensation_removes_a_drift_that_varies_smoothly() -> None:
    """Old = new minus a drift that depends on where the vector lies: the kernel average of the
    fitting pairs' drifts recovers it for new queries, where no global rotation can."""
    rng = np.random.default_rng(4)
    d = 16
    new = rng.standard_normal((3000, d))
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    drift = 0.3 * np.tanh(3 * new[:, :1]) * np.eye(d)[1]
    old = new - drift
    old /= np.linalg.norm(old, axis=1, keepdims=True)
    fit, held = slice(0, 2500), slice(2500, None)
    new32, old32 = new.astype(np.float32), old.astype(np.float32)
    qdc = fitted("qdc_query", old32[fit], new32[fit], sigma=0.2)
    rotation = fitted("procrustes_query", old32[fit], new32[fit])
    assert qdc.psi.base.weight_t.shape == (d, d)  # equal dimensions: the identity, as the paper
    torch.testing.assert_close(qdc.psi.base.weight_t, torch.eye(d))
    compensated = mean_cosine(apply(qdc, new32[held]), old32[held])
    assert compensated > mean_cosine(apply(rotation, new32[held]), old32[held])
    assert compensated > mean_cosine(new32[held], old32[held])


def test_query_drift_compensation_across_dimensions_aligns_first_and_refuses_the_identity() -> None:
    rng = np.random.default_rng(5)
    old = rng.standard_normal((500, 8)).astype(np.float32)
    new = (old @ random_orthogonal(8, 12, rng)).astype(np.float32)
    head = fitted("qdc_query", old, new, max_anchors=100)
    assert int(head.psi.used) == 100
    assert mean_cosine(apply(head, new), old) > 0.99
    with pytest.raises(UserError, match="needs equal dimensions"):
        fitted("qdc_query", old, new, base="identity")


def test_the_report_says_what_share_of_the_old_to_new_gap_an_adapter_closes() -> None:
    from modelupgrade.report.adapters import _gap_closed

    assert _gap_closed(0.55, 0.40, 0.60) == pytest.approx(75.0)
    assert _gap_closed(0.40, 0.40, 0.60) == 0.0
    assert _gap_closed(0.50, 0.60, 0.60) is None  # no gap to close
