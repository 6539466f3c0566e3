"""A cutover gate that cannot pass trivially: the shadow evaluation holds its query sample's items
out of the gallery it scores (a query that is a stored item used to find itself: top-1 1.0 in
both spaces, no flips, whatever the new space was worth), and a dead old model is judged by its
stored vectors of the sampled items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from modelupgrade.cli.arguments import run_command
from modelupgrade.commands.store import cutover as cutover_command
from modelupgrade.config import parse_params
from modelupgrade.data.vector_table import write_vector_table
from modelupgrade.errors import UserError
from modelupgrade.evaluation import RetrievalEvaluator
from modelupgrade.ordering import build_ordering
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    ItemSources,
    SpaceSpec,
    TableVectors,
    TransformStored,
)
from modelupgrade.store.cutover import cutover
from modelupgrade.store.shadow import QuerySample, shadow_evaluate
from tests.store_helpers import PROJECT_PARAMS

OLD = SpaceSpec("gen0", 16)
NEW = SpaceSpec("gen1", 12, upgrades_from=("gen0",))
CLASSES, ITEMS, SAMPLE = 6, 240, 30


def params():
    return parse_params(yaml.safe_load(PROJECT_PARAMS.read_text()))


def labelled_store(path: Path, new_quality: float) -> tuple[GalleryStore, list[str], np.ndarray]:
    """A store of labelled items with fair old vectors, and new vectors whose class signal is
    ``new_quality`` (0: noise), backfilled from a table."""
    rng = np.random.default_rng(3)
    labels = np.arange(ITEMS) % CLASSES
    ids = [f"sku-{i:06d}" for i in range(ITEMS)]
    old = rng.normal(size=(CLASSES, OLD.dim))[labels] + 1.0 * rng.normal(size=(ITEMS, OLD.dim))
    new = new_quality * rng.normal(size=(CLASSES, NEW.dim))[labels] + rng.normal(
        size=(ITEMS, NEW.dim)
    )
    store = GalleryStore.create(path, BackendSettings())
    store.ingest(ids, old.astype(np.float32), OLD, ItemSources(ids, labels=labels.tolist()))
    job = BackfillJob(
        store,
        NEW,
        TableVectors(ids, new.astype(np.float32)),
        build_ordering("random"),
        64,
        progress=False,
    )
    assert job.run().status == "complete"
    return store, ids, labels


def stored_sample(store: GalleryStore, ids: list[str], labels: np.ndarray) -> QuerySample:
    """The first SAMPLE items as queries, embedded exactly as the store holds them (what a team
    gets when it samples its own gallery)."""
    slots = np.arange(SAMPLE)
    return QuerySample(
        labels[:SAMPLE],
        store.read_vectors(NEW.name, slots),
        store.read_vectors(OLD.name, slots),
        "stored items",
        tuple(ids[:SAMPLE]),
    )


def test_queries_that_are_stored_items_are_held_out_so_a_worthless_new_space_is_refused(
    tmp_path,
):
    store, ids, labels = labelled_store(tmp_path / "s", new_quality=0.0)
    sample = stored_sample(store, ids, labels)
    with store:
        backfill = store.backfills.last()
        evaluation = shadow_evaluate(store, backfill, sample, params())
        # The numbers are the evaluator's on the gallery without the sample's items.
        evaluator = RetrievalEvaluator(
            params().evaluation, labels[:SAMPLE], labels[SAMPLE:], leave_one_out=False
        )
        rest = np.arange(SAMPLE, ITEMS)
        for space, metrics in (
            (NEW.name, evaluation.new_metrics),
            (OLD.name, evaluation.old_metrics),
        ):
            query = store.read_vectors(space, np.arange(SAMPLE))
            expected = evaluator.evaluate(query, store.read_vectors(space, rest)).metrics
            assert metrics == pytest.approx({k: float(v) for k, v in expected.items()})
        assert evaluation.held_out_stored_queries == SAMPLE and evaluation.gallery == ITEMS - SAMPLE
        # A query finding itself made both spaces perfect; held out, noise is noise.
        assert evaluation.new_metrics["top1"] < 0.5 < evaluation.old_metrics["top1"]
        assert not evaluation.passed
        with pytest.raises(UserError, match="shadow evaluation failed"):
            cutover(store, "go", 1.0, lambda b: shadow_evaluate(store, b, sample, params()))
        assert store.status().as_dict()["serving_steps"] == []


def test_a_dead_old_model_is_judged_by_its_stored_vectors_of_the_sampled_items(tmp_path):
    store, ids, labels = labelled_store(tmp_path / "s", new_quality=3.0)
    sample = QuerySample(labels[:SAMPLE], None, None, "stored items", tuple(ids[:SAMPLE]))
    with store:
        evaluation = shadow_evaluate(store, store.backfills.last(), sample, params())
        assert evaluation.query_vectors == {
            "new": "the store's 'gen1' vectors",
            "old": "the store's 'gen0' vectors",
        }
        assert evaluation.passed and evaluation.held_out_stored_queries == SAMPLE
        outsiders = QuerySample(labels[:2], None, None, "outsiders", ("nope-1", "nope-2"))
        with pytest.raises(UserError, match="2 of the 2 queries are not stored items"):
            shadow_evaluate(store, store.backfills.last(), outsiders, params())


def test_a_psi_backfills_stored_vectors_are_not_taken_for_the_new_models_queries(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.arange(ITEMS) % CLASSES
    ids = [f"i{i}" for i in range(ITEMS)]
    store = GalleryStore.create(tmp_path / "s", BackendSettings())
    old = rng.normal(size=(CLASSES, OLD.dim))[labels] + rng.normal(size=(ITEMS, OLD.dim))
    store.ingest(ids, old.astype(np.float32), OLD, ItemSources(ids, labels=labels.tolist()))
    matrix = rng.normal(size=(OLD.dim, NEW.dim)).astype(np.float32)
    job = BackfillJob(
        store,
        NEW,
        TransformStored(lambda v: v @ matrix),
        build_ordering("random"),
        64,
        progress=False,
    )
    assert job.run().status == "complete"
    sample = QuerySample(labels[:SAMPLE], None, None, "stored", tuple(ids[:SAMPLE]))
    with store, pytest.raises(UserError, match="(?s)transform backfill.*--new-model"):
        shadow_evaluate(store, store.backfills.last(), sample, params())


def test_the_cutover_command_takes_a_plain_query_table_and_a_vector_table(tmp_path, capsys):
    store, _, _ = labelled_store(tmp_path / "s", new_quality=3.0)
    store.close()
    rng = np.random.default_rng(9)
    # Held-out queries (not stored items) as a plain table of item_id and label, their vectors in
    # the one vector format, the new ones in another row order: they are looked up by id.
    queries = [f"query-{i}" for i in range(12)]
    q_labels = np.arange(12) % CLASSES
    pd.DataFrame({"item_id": queries, "label": q_labels}).to_csv(tmp_path / "q.csv", index=False)
    with GalleryStore.open(tmp_path / "s") as opened:
        new_like = opened.read_vectors(NEW.name, np.arange(12)) + 0.01 * rng.normal(
            size=(12, NEW.dim)
        )
        old_like = opened.read_vectors(OLD.name, np.arange(12)) + 0.01 * rng.normal(
            size=(12, OLD.dim)
        )
    order = rng.permutation(12)
    write_vector_table(tmp_path / "new.parquet", [queries[i] for i in order], new_like[order])
    write_vector_table(tmp_path / "old.parquet", queries, old_like)
    run_command(
        cutover_command,
        [
            *("--params", str(PROJECT_PARAMS), "--store", str(tmp_path / "s")),
            *("--reason", "held-out queries pass", "--query-split", str(tmp_path / "q.csv")),
            *("--new-query-vectors", str(tmp_path / "new.parquet")),
            *("--old-query-vectors", str(tmp_path / "old.parquet")),
        ],
    )
    with GalleryStore.open(tmp_path / "s") as opened:
        steps = opened.status().as_dict()["serving_steps"]
    assert [step["step"] for step in steps] == ["cutover"]
