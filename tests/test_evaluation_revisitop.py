"""Revisited Oxford/Paris queries are scored by revisitop's protocol, each set on its own gallery.

The split files are what the GLDv2 loader writes: query rows name their set (``revisited_set``)
and carry the protocol's ground truth as gallery item ids (``gnd_easy`` / ``gnd_hard`` /
``gnd_junk``). The embeddings are built so that each query ranks its set's gallery in a hand-made
order (gallery vectors are one-hot, a query vector holds its scores), and the expected Easy /
Medium / Hard numbers come from ``metrics.revisitop_map`` on those hand-made ranks, or by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from modelupgrade.config import parse_params
from modelupgrade.errors import UserError
from modelupgrade.evaluation.scenario import evaluate_scenario
from modelupgrade.layout import StudyLayout
from modelupgrade.metrics import REVISITOP_PROTOCOLS, revisitop_ground_truth, revisitop_map

KAPPAS = (1, 5, 10)
OLD, NEW = "gen0", "gen1-independent"


@dataclass(frozen=True)
class Query:
    easy: tuple[int, ...]
    hard: tuple[int, ...]
    junk: tuple[int, ...]


# Two sets, each with its own gallery (local indices 0..n-1) and a few queries.
SETS: dict[str, tuple[int, list[Query]]] = {
    "roxford5k": (
        6,
        [
            Query(easy=(0,), hard=(1, 2), junk=(3,)),
            Query(easy=(2, 4), hard=(), junk=(0,)),
            Query(easy=(), hard=(5,), junk=(1,)),  # no Easy positive: left out of Easy
        ],
    ),
    "rparis6k": (
        5,
        [
            Query(easy=(1,), hard=(3,), junk=(0, 4)),
            Query(easy=(0, 2), hard=(4,), junk=()),
        ],
    ),
}

# A hand-made ranking of the set's own gallery per query (best first), junk and hard items
# placed so that every protocol gives a different, non-trivial score.
HAND_RANKS: dict[str, list[list[int]]] = {
    "roxford5k": [[3, 1, 4, 0, 2, 5], [2, 0, 5, 4, 1, 3], [1, 0, 5, 2, 3, 4]],
    "rparis6k": [[0, 3, 2, 1, 4], [2, 4, 1, 0, 3]],
}


def perfect_ranks(junk_first: bool) -> dict[str, list[list[int]]]:
    """Every query ranks easy, then hard, then the rest; junk first or last."""
    ranks = {}
    for name, (size, queries) in SETS.items():
        ranks[name] = []
        for q in queries:
            rest = [i for i in range(size) if i not in (*q.easy, *q.hard, *q.junk)]
            good = [*q.easy, *q.hard]
            order = [*q.junk, *good, *rest] if junk_first else [*good, *rest, *q.junk]
            ranks[name].append(order)
    return ranks


def _ids(name: str, kind: str, indices: tuple[int, ...] | range) -> list[str]:
    return [f"{name}/{kind}/{i}" for i in indices]


def split_frames(extra_label_queries: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Query and gallery split rows as the GLDv2 loader and the predefined split write them.

    The two sets' rows are interleaved, so that a set's rows are not a contiguous block of the
    split. Labels are what the loader gives (the query's landmark; other gallery items a
    distractor class), so scoring by label would count junk as negative."""
    query_rows, gallery_rows = [], []
    for s, (name, (size, queries)) in enumerate(SETS.items()):
        positive = {i for q in queries for i in (*q.easy, *q.hard)}
        for i in range(size):
            gallery_rows.append(
                {
                    "item_id": f"{name}/gallery/{i}",
                    "label": 2 * s + (0 if i in positive else 1),
                    "revisited_set": name,
                    "gnd_easy": "",
                    "gnd_hard": "",
                    "gnd_junk": "",
                    "order": i,
                }
            )
        for j, q in enumerate(queries):
            query_rows.append(
                {
                    "item_id": f"{name}/query/{j}",
                    "label": 2 * s,
                    "revisited_set": name,
                    "gnd_easy": " ".join(_ids(name, "gallery", q.easy)),
                    "gnd_hard": " ".join(_ids(name, "gallery", q.hard)),
                    "gnd_junk": " ".join(_ids(name, "gallery", q.junk)),
                    "order": j,
                }
            )
    query = pd.DataFrame(query_rows).sort_values("order", kind="stable")
    gallery = pd.DataFrame(gallery_rows).sort_values("order", kind="stable")
    return (
        query.drop(columns="order").reset_index(drop=True),
        gallery.drop(columns="order").reset_index(drop=True),
    )


def embeddings(
    query: pd.DataFrame,
    gallery: pd.DataFrame,
    ranks: dict[str, list[list[int]]],
    other_set_first: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """One-hot gallery vectors and query vectors that hold each query's scores: under cosine (and
    any of the similarities) the query ranks its set's gallery in the order of ``ranks``. With
    ``other_set_first`` every item of the other set scores above every item of its own set."""
    position = {item: row for row, item in enumerate(gallery.item_id)}
    vectors = np.zeros((len(query), len(gallery)), dtype=np.float32)
    for row, item in enumerate(query.item_id):
        name, _, index = item.split("/")
        own = ranks[name][int(index)]
        size = len(own)
        vectors[row] = -1.0  # the other set's gallery: below the own set ...
        if other_set_first:
            vectors[row] = 2.0 + np.arange(len(gallery)) / len(gallery)  # ... or above it
        for rank, local in enumerate(own):
            vectors[row, position[f"{name}/gallery/{local}"]] = 1.0 - rank / size
    return vectors, np.eye(len(gallery), dtype=np.float32)


def expected_from_ranks(ranks: dict[str, list[list[int]]]) -> dict[str, float]:
    """``metrics.revisitop_map`` on each set's hand-made ranks (gallery × queries)."""
    expected = {}
    for name, (_, queries) in SETS.items():
        columns = np.asarray(ranks[name]).T
        for protocol in REVISITOP_PROTOCOLS:
            gnd = revisitop_ground_truth(
                [q.easy for q in queries],
                [q.hard for q in queries],
                [q.junk for q in queries],
                protocol,  # type: ignore[arg-type]
            )
            m, mp = revisitop_map(columns, gnd, KAPPAS)
            expected[f"{name}/{protocol}/mAP"] = m
            for k, v in zip(KAPPAS, mp, strict=True):
                expected[f"{name}/{protocol}/mP@{k}"] = float(v)
    return expected


def run_study(
    root: Path,
    query: pd.DataFrame,
    gallery: pd.DataFrame,
    spaces: dict[str, tuple[np.ndarray, np.ndarray]],
    **evaluation: object,
) -> pd.DataFrame:
    """Write the split files and the embeddings of gen0 and gen1-independent, evaluate the
    scenario, and return its cross-model table."""
    splits = root / "data/splits/sc"
    splits.mkdir(parents=True, exist_ok=True)
    query.to_parquet(splits / "query.parquet")
    gallery.to_parquet(splits / "gallery.parquet")
    for model, (q, g) in spaces.items():
        out = root / "embeddings/sc" / model
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "query.npy", q)
        np.save(out / "gallery.npy", g)
    params = parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": ["independent"]}},
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}},
            "sequential": {"strategies": []},
            "evaluation": {
                "headline_metric": "roxford5k/medium/mAP",
                "heatmap_metrics": ["roxford5k/medium/mAP", "top1"],
                **evaluation,
            },
        }
    )
    evaluate_scenario(params, "sc", StudyLayout(root))
    return pd.read_parquet(root / "metrics/sc/cross_model.parquet")


def metric(table: pd.DataFrame, query_set: str, gallery_set: str, name: str) -> float:
    rows = table[
        (table.query_set == query_set) & (table.gallery_set == gallery_set) & (table.metric == name)
    ]
    assert len(rows) == 1, (
        f"no {name} for {query_set} -> {gallery_set}; metrics: {sorted(set(table.metric))}"
    )
    return float(rows.value.iloc[0])


def test_easy_medium_hard_per_set_are_revisitop_map_on_the_sets_own_ranking(
    tmp_path: Path,
) -> None:
    query, gallery = split_frames()
    hand = embeddings(query, gallery, HAND_RANKS)
    perfect = embeddings(query, gallery, perfect_ranks(junk_first=False))
    table = run_study(tmp_path, query, gallery, {OLD: hand, NEW: perfect})
    expected = expected_from_ranks(HAND_RANKS)
    assert len(expected) == 2 * 3 * 4
    for name, value in expected.items():
        assert metric(table, OLD, OLD, name) == pytest.approx(value, abs=1e-12), name
    # Oxford, Medium, by hand (trapezoid AP after junk removal; mP@k with kq = min(max pos, k)):
    # q0 keeps [1, 4, 0, 2, 5] → positives at 0, 2, 3: (1 + 7/12 + 17/24) / 3 = 55/72;
    # q1 keeps [2, 5, 4, 1, 3] → positives at 0, 2: (1 + 7/12) / 2 = 19/24;
    # q2 keeps [0, 5, 2, 3, 4] → positive at 1: (0 + 1/2) / 2 = 1/4.
    assert metric(table, OLD, OLD, "roxford5k/medium/mAP") == pytest.approx(
        (55 / 72 + 19 / 24 + 1 / 4) / 3, abs=1e-12
    )
    assert metric(table, OLD, OLD, "roxford5k/medium/mP@1") == pytest.approx(2 / 3, abs=1e-12)
    assert metric(table, OLD, OLD, "roxford5k/medium/mP@5") == pytest.approx(23 / 36, abs=1e-12)
    # Easy leaves q2 (no easy positive) out; Hard leaves q1 out.
    assert metric(table, OLD, OLD, "roxford5k/easy/mAP") == pytest.approx(25 / 48, abs=1e-12)
    assert metric(table, OLD, OLD, "roxford5k/hard/mAP") == pytest.approx(25 / 48, abs=1e-12)
    # Every pair is scored the same way (here: the new model ranks every set perfectly).
    for name in expected:
        assert metric(table, NEW, NEW, name) == 1.0, name
    # No label-based numbers: every query belongs to a revisited set.
    assert not {"mAP", "top1", "top5"} & set(table.metric)
    summary = (tmp_path / "metrics/sc/summary.json").read_text()
    assert '"roxford5k/medium/mAP"' in summary


def test_junk_items_never_lower_the_score(tmp_path: Path) -> None:
    query, gallery = split_frames()
    junk_first = embeddings(query, gallery, perfect_ranks(junk_first=True))
    junk_last = embeddings(query, gallery, perfect_ranks(junk_first=False))
    table = run_study(tmp_path, query, gallery, {OLD: junk_first, NEW: junk_last})
    names = expected_from_ranks(perfect_ranks(junk_first=True))
    for name in names:
        # Junk ranked above every positive is removed, never counted as a negative.
        assert metric(table, OLD, OLD, name) == 1.0, name
        assert metric(table, OLD, OLD, name) == metric(table, NEW, NEW, name), name

    # Hard items are junk under Easy, easy items junk under Hard: ranked first, they cost nothing.
    def first(kind: str) -> dict[str, list[list[int]]]:
        ranks = {}
        for name, (_, queries) in SETS.items():
            ranks[name] = []
            for q, order in zip(queries, perfect_ranks(junk_first=False)[name], strict=True):
                lead = [*q.hard, *q.easy] if kind == "hard" else [*q.easy, *q.hard]
                ranks[name].append([*lead, *(i for i in order if i not in lead)])
        return ranks

    spaces = {
        OLD: embeddings(query, gallery, first("hard")),
        NEW: embeddings(query, gallery, first("easy")),
    }
    table = run_study(tmp_path / "protocol-junk", query, gallery, spaces)
    for name in SETS:
        assert metric(table, OLD, OLD, f"{name}/easy/mAP") == 1.0
        assert metric(table, NEW, NEW, f"{name}/hard/mAP") == 1.0


def test_a_query_never_retrieves_the_other_sets_gallery(tmp_path: Path) -> None:
    query, gallery = split_frames()
    own_set_only = embeddings(query, gallery, HAND_RANKS)
    other_set_first = embeddings(query, gallery, HAND_RANKS, other_set_first=True)
    table = run_study(tmp_path, query, gallery, {OLD: own_set_only, NEW: other_set_first}, flip_k=1)
    expected = expected_from_ranks(HAND_RANKS)
    for name, value in expected.items():
        # The other set's items outrank every own item, yet the numbers are those of the own
        # set's ranking: the other gallery is not part of the ranking at all.
        assert metric(table, NEW, NEW, name) == pytest.approx(value, abs=1e-12), name
        assert metric(table, NEW, NEW, name) == metric(table, OLD, OLD, name)
    # Nor does it decide the negative flips (top-1 under Medium after junk removal).
    assert metric(table, NEW, NEW, "negative_flip_rate") == 0.0


def test_label_queries_beside_revisited_sets_are_scored_by_label_on_their_own_gallery(
    tmp_path: Path,
) -> None:
    query, gallery = split_frames()
    rng = np.random.default_rng(0)
    labels = np.arange(12) % 3
    plain_query = pd.DataFrame(
        {"item_id": [f"plain/query/{i}" for i in range(6)], "label": 10 + labels[:6]}
    )
    plain_gallery = pd.DataFrame(
        {"item_id": [f"plain/gallery/{i}" for i in range(12)], "label": 10 + labels}
    )
    for frame in (plain_query, plain_gallery):
        frame[["revisited_set", "gnd_easy", "gnd_hard", "gnd_junk"]] = ""
    q_all = pd.concat([plain_query, query], ignore_index=True)
    g_all = pd.concat([gallery, plain_gallery], ignore_index=True)
    hand_q, hand_g = embeddings(query, gallery, HAND_RANKS)
    dim = hand_q.shape[1] + 3
    plain_q = np.zeros((6, dim), np.float32)
    plain_g = np.zeros((12, dim), np.float32)
    plain_q[np.arange(6), hand_q.shape[1] + labels[:6]] = 1.0
    # Every revisited gallery item would outrank the plain ones if it were in their ranking.
    plain_q[:, : hand_q.shape[1]] = 2.0
    plain_g[np.arange(12), hand_q.shape[1] + labels] = 1.0
    plain_g += 0.01 * rng.standard_normal(plain_g.shape).astype(np.float32)
    q_vectors = np.vstack([plain_q, np.pad(hand_q, ((0, 0), (0, 3)))])
    g_vectors = np.vstack([np.pad(hand_g, ((0, 0), (0, 3))), plain_g])
    table = run_study(
        tmp_path, q_all, g_all, {OLD: (q_vectors, g_vectors), NEW: (q_vectors, g_vectors)}
    )
    for name, value in expected_from_ranks(HAND_RANKS).items():
        assert metric(table, OLD, OLD, name) == pytest.approx(value, abs=1e-12), name
    # The plain queries find their label among the plain gallery items only.
    assert metric(table, OLD, OLD, "top1") == 1.0
    assert metric(table, OLD, OLD, "mAP") == 1.0


def test_inconsistent_revisited_ground_truth_is_a_clear_error(tmp_path: Path) -> None:
    query, gallery = split_frames()
    vectors = embeddings(query, gallery, HAND_RANKS)
    spaces = {OLD: vectors, NEW: vectors}
    # A ground-truth id of the other set's gallery is no positive of this set.
    wrong = query.copy()
    wrong.loc[0, "gnd_easy"] = "rparis6k/gallery/0"
    with pytest.raises(UserError, match="not a gallery item of roxford5k"):
        run_study(tmp_path / "a", wrong, gallery, spaces)
    # Ground truth without the column naming each query's set (a split from an older loader).
    with pytest.raises(UserError, match="revisited_set"):
        run_study(tmp_path / "b", query.drop(columns="revisited_set"), gallery, spaces)
    # A headline metric the evaluation does not compute.
    with pytest.raises(UserError, match="roxford5k/medium/mAP"):
        run_study(tmp_path / "c", query, gallery, spaces, headline_metric="mAP")


def test_gldv2_split_files_carry_each_sets_ground_truth_to_the_evaluator(tmp_path: Path) -> None:
    """GLDv2 loader → predefined split files → the evaluator's decision: two sets, each scored on
    its own gallery with its easy/hard/junk lists."""
    import pickle

    from modelupgrade.data import build_manifest
    from modelupgrade.data.scenarios import make_scenario_splits
    from modelupgrade.data.split_files import write_splits
    from modelupgrade.evaluation.revisited import EvaluationGroundTruth
    from modelupgrade.retrieval.protocol import read_split_frames
    from tests.data_fixtures import make_params

    pd.DataFrame({"landmark_id": ["1", "2"], "images": ["abc1 abc2", "bcd1 bcd2"]}).to_csv(
        tmp_path / "train_clean.csv", index=False
    )
    for name, (size, queries) in SETS.items():
        gnd = {
            "imlist": [f"im{i}" for i in range(size)],
            "qimlist": [f"landmark_{j}" for j in range(len(queries))],
            "gnd": [
                {"bbx": None, "easy": list(q.easy), "hard": list(q.hard), "junk": list(q.junk)}
                for q in queries
            ],
        }
        (tmp_path / name).mkdir()
        (tmp_path / name / f"gnd_{name}.pkl").write_bytes(pickle.dumps(gnd))
    params = make_params(
        tmp_path,
        loader="gldv2",
        min_images_per_class=1,
        gldv2={"revisited_sets": list(SETS)},
    )
    params = params.model_copy(
        update={
            "evaluation_split": params.evaluation_split.model_copy(
                update={"protocol": "predefined"}
            )
        }
    )
    splits = make_scenario_splits(
        build_manifest(params.dataset),
        params.scenario("extended-data"),
        params.dataset,
        params.evaluation_split,
        params.seed,
    )
    write_splits(tmp_path / "splits", splits)
    query, gallery, leave_one_out = read_split_frames(
        "auto", tmp_path / "splits/query.parquet", tmp_path / "splits/gallery.parquet"
    )
    truth = EvaluationGroundTruth.from_splits(query, gallery, leave_one_out)
    assert [s.name for s in truth.revisited] == list(SETS)
    assert len(truth.label_queries) == 0 and len(truth.label_gallery) == 0
    for revisited in truth.revisited:
        size, queries = SETS[revisited.name]
        assert set(gallery.item_id.iloc[revisited.gallery_rows]) == {
            f"{revisited.name}/gallery/im{i}" for i in range(size)
        }
        # Positions in the set's own gallery, whatever its rows' order in the split.
        own = list(gallery.item_id.iloc[revisited.gallery_rows])
        for j, q in enumerate(queries):
            for kind in ("easy", "hard", "junk"):
                found = [own[i] for i in getattr(revisited, kind)[j]]
                assert found == [f"{revisited.name}/gallery/im{i}" for i in getattr(q, kind)]
