"""The Ray executor of the backfill job (``modelupgrade.scale.ray_backfill``) writes what the
one-process job does.

A local Ray cluster of 2 CPUs runs the chunks on 2 actors. Two stores are built alike; one is
backfilled by ``BackfillJob`` computing in this process, the other by the same job with the Ray
executor, interrupted after 2 chunks and resumed. Both must end with the same item states, the same
chunk log (the SHA-256 of every chunk's vectors included, so the vectors are bitwise equal) and the
same vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from modelupgrade.errors import UserError
from modelupgrade.heads import build_head, save_head
from modelupgrade.models import save_model
from modelupgrade.ordering import build_ordering
from modelupgrade.runtime import seed_everything
from modelupgrade.store import (
    BackfillJob,
    GalleryStore,
    ImageFileSource,
)
from tests.model_fixtures import tiny_model
from tests.store_helpers import NEW, OLD, build_gallery, image_gallery, write_images

ray = pytest.importorskip("ray")
from modelupgrade.scale.ray_backfill import (  # only with the [scale] extra
    HeadVectors,
    ModelVectors,
    RayExecutor,
    WorkerPool,
)

pytestmark = pytest.mark.scale

ITEMS, CHUNK_SIZE, CORRUPT = 40, 6, 17
TWO_CPU_WORKERS = WorkerPool(workers=2, gpus_per_worker=0, cpus_per_worker=1)


@pytest.fixture(scope="module", autouse=True)
def local_ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedding model of NEW's dimension, saved as the train stage saves one."""
    seed_everything(0)
    model = tiny_model(NEW.dim).eval()
    out = tmp_path_factory.mktemp("models") / "gen1"
    save_model(model, out, {"generation": 1})
    return out


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("images"), ITEMS, 16, corrupt={CORRUPT})


def _image_store(path: Path) -> GalleryStore:
    return image_gallery(path, ITEMS, seed=1)


def run_ray_backfill(store, target, recipe, policy, chunk_size, pool, max_chunks=None):
    executor = RayExecutor(recipe, pool)
    return BackfillJob(store, target, executor, policy, chunk_size, progress=False).run(max_chunks)


def _outcome(store: GalleryStore) -> tuple[list[dict], list[tuple], np.ndarray]:
    chunk_log = sorted(
        (c["chunk"], c["items"], c["written"], c["failed"], c["vectors_sha256"])
        for c in store.backfills.chunk_log()
    )
    states = store.backfills.item_states()
    done = np.array([s["slot"] for s in states if s["state"] == "done"])
    return states, chunk_log, store.read_vectors(NEW.name, done)


def _assert_same_outcome(single: GalleryStore, on_ray: GalleryStore) -> None:
    states, chunk_log, vectors = _outcome(single)
    ray_states, ray_chunk_log, ray_vectors = _outcome(on_ray)
    assert ray_states == states
    assert ray_chunk_log == chunk_log
    np.testing.assert_array_equal(ray_vectors, vectors)


def test_re_embedding_images_on_two_ray_workers_equals_the_single_process_job(
    tmp_path: Path, model_dir: Path, image_root: Path
) -> None:
    recipe = ModelVectors(str(model_dir), ImageFileSource(image_root), batch_size=4)
    policy = build_ordering("old-confidence")
    with _image_store(tmp_path / "single") as single, _image_store(tmp_path / "ray") as on_ray:
        report = BackfillJob(
            single, NEW, recipe.build("cpu"), policy, CHUNK_SIZE, progress=False
        ).run()
        assert report.status == "incomplete" and report.items_failed == 1

        first = run_ray_backfill(
            on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS, max_chunks=2
        )
        assert (first.status, first.chunks_committed) == ("paused", 2)
        pending = on_ray.backfills.next_chunks(on_ray.backfills.active(), limit=None)
        assert len(pending) == -(-ITEMS // CHUNK_SIZE) - 2
        second = run_ray_backfill(on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS)
        assert second.status == "incomplete"
        assert first.items_written + second.items_written == ITEMS - 1
        assert [f.item_id for f in second.failed] == [f"img{CORRUPT}"]
        _assert_same_outcome(single, on_ray)


def _bict_head(directory: Path, out_dim: int = NEW.dim) -> Path:
    """A small BiCT head from OLD to ``out_dim``, seeded, saved in ``directory``."""
    torch.manual_seed(0)
    save_head(build_head("bict", OLD.dim, out_dim, hidden_dim=8, depth=2), directory)
    return directory


def test_applying_psi_to_stored_vectors_on_ray_equals_the_single_process_job(
    tmp_path: Path,
) -> None:
    recipe = HeadVectors(str(_bict_head(tmp_path / "bict")))
    policy = build_ordering("random")
    with (
        build_gallery(tmp_path / "single", 50) as single,
        build_gallery(tmp_path / "ray", 50) as on_ray,
    ):
        BackfillJob(single, NEW, recipe.build("cpu"), policy, CHUNK_SIZE, progress=False).run()
        report = run_ray_backfill(on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS)
        assert (report.status, report.items_written, report.chunks_committed) == ("complete", 50, 9)
        _assert_same_outcome(single, on_ray)


def test_a_user_error_in_a_worker_reaches_the_caller_as_itself(tmp_path: Path) -> None:
    head_dir = _bict_head(tmp_path / "too-narrow", out_dim=NEW.dim - 2)
    with build_gallery(tmp_path / "store", 12) as store:
        with pytest.raises(UserError, match="produces 10-d vectors, but space 'gen1' holds 12-d"):
            run_ray_backfill(
                store,
                NEW,
                HeadVectors(str(head_dir)),
                build_ordering("ingest-order"),
                CHUNK_SIZE,
                TWO_CPU_WORKERS,
            )
        assert store.status().backfill.pending == 12, "nothing was committed"


def test_the_ray_executor_computes_every_pending_chunk_and_returns_them_in_plan_order(
    tmp_path: Path,
) -> None:
    head_dir = _bict_head(tmp_path / "bict")
    with build_gallery(tmp_path / "store", 20) as store:
        BackfillJob(
            store,
            NEW,
            HeadVectors(str(head_dir)).build("cpu"),
            build_ordering("ingest-order"),
            3,
            progress=False,
        ).run(max_chunks=1)
        backfill = store.backfills.active()
        pending = store.backfills.next_chunks(backfill, limit=None)
        assert [chunk.index for chunk in pending] == [1, 2, 3, 4, 5, 6]
        computed = list(
            RayExecutor(HeadVectors(str(head_dir)), TWO_CPU_WORKERS).computed(store, backfill, NEW)
        )
        assert [chunk.index for chunk, _ in computed] == [1, 2, 3, 4, 5, 6]
        assert all(result.slots.tolist() == chunk.slots.tolist() for chunk, result in computed)
