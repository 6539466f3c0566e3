"""The Ray Data backfill (``modelupgrade.scale.ray_backfill``) writes what the one-process job does.

A local Ray cluster of 2 CPUs runs the chunks on 2 actors. Two stores are built alike; one is
backfilled by ``BackfillJob`` in this process, the other on Ray, interrupted after 2 chunks and
resumed. Both must end with the same item states, the same chunk log (the SHA-256 of every chunk's
vectors included, so the vectors are bitwise equal) and the same vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.heads import build_head, save_head
from modelupgrade.models import EmbeddingModel, save_model
from modelupgrade.runtime import seed_everything
from modelupgrade.store import (
    BackfillJob,
    GalleryStore,
    ImageFileSource,
    ItemSources,
    TransformStored,
    build_policy,
)
from tests.store_helpers import NEW, OLD, build_gallery

ray = pytest.importorskip("ray")
from modelupgrade.scale.ray_backfill import (  # noqa: E402 - only with the [scale] extra
    HeadVectors,
    ModelVectors,
    WorkerPool,
    pending_chunks,
    run_ray_backfill,
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
    architecture = ArchitectureParams(
        backbone="resnet10t",
        cifar_stem=False,
        embedding_dim=NEW.dim,
        backbone_kwargs={"channels": [8, 8, 8, 8], "stem_width": 8},
    )
    seed_everything(0)
    model = EmbeddingModel(architecture, in_chans=1, num_classes=4, input_size=16).eval()
    out = tmp_path_factory.mktemp("models") / "gen1"
    save_model(model, out, {"generation": 1})
    return out


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(ITEMS):
        if i == CORRUPT:
            (root / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
        else:
            Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(root / f"{i}.png")
    return root


def _image_store(path: Path) -> GalleryStore:
    rng = np.random.default_rng(1)
    store = GalleryStore.create(path)
    store.ingest(
        [f"img{i}" for i in range(ITEMS)],
        rng.normal(size=(ITEMS, OLD.dim)),
        OLD,
        ItemSources([f"{i}.png" for i in range(ITEMS)]),
        scores=rng.random(ITEMS),
    )
    return store


def _outcome(store: GalleryStore) -> tuple[list[dict], list[tuple], np.ndarray]:
    chunk_log = sorted(
        (c["chunk"], c["items"], c["written"], c["failed"], c["vectors_sha256"])
        for c in store.chunk_log()
    )
    states = store.item_states()
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
    policy = build_policy("old-confidence")
    with _image_store(tmp_path / "single") as single, _image_store(tmp_path / "ray") as on_ray:
        report = BackfillJob(
            single, NEW, recipe.build("cpu"), policy, CHUNK_SIZE, progress=False
        ).run()
        assert report.status == "complete" and report.items_failed == 1

        first = run_ray_backfill(
            on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS, max_chunks=2, progress=False
        )
        assert (first.status, first.chunks_committed) == ("paused", 2)
        assert len(pending_chunks(on_ray, on_ray.active_backfill())) == -(-ITEMS // CHUNK_SIZE) - 2
        second = run_ray_backfill(
            on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS, progress=False
        )
        assert second.status == "complete"
        assert first.items_written + second.items_written == ITEMS - 1
        assert [f["item_id"] for f in second.failed] == [f"img{CORRUPT}"]
        _assert_same_outcome(single, on_ray)


def test_applying_psi_to_stored_vectors_on_ray_equals_the_single_process_job(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    head_dir = tmp_path / "bict"
    save_head(build_head("bict", OLD.dim, NEW.dim, hidden_dim=8, depth=2), head_dir)
    recipe = HeadVectors(str(head_dir))
    policy = build_policy("random", seed=3)
    with (
        build_gallery(tmp_path / "single", 50) as single,
        build_gallery(tmp_path / "ray", 50) as on_ray,
    ):
        BackfillJob(single, NEW, recipe.build("cpu"), policy, CHUNK_SIZE, progress=False).run()
        report = run_ray_backfill(
            on_ray, NEW, recipe, policy, CHUNK_SIZE, TWO_CPU_WORKERS, progress=False
        )
        assert (report.status, report.items_written, report.chunks_committed) == ("complete", 50, 9)
        _assert_same_outcome(single, on_ray)


def test_a_user_error_in_a_worker_reaches_the_caller_as_itself(tmp_path: Path) -> None:
    head_dir = tmp_path / "too-narrow"
    save_head(build_head("bict", OLD.dim, NEW.dim - 2, hidden_dim=8, depth=2), head_dir)
    with build_gallery(tmp_path / "store", 12) as store:
        with pytest.raises(UserError, match="produces 10-d vectors, but space 'gen1' holds 12-d"):
            run_ray_backfill(
                store,
                NEW,
                HeadVectors(str(head_dir)),
                build_policy("ingest-order"),
                CHUNK_SIZE,
                TWO_CPU_WORKERS,
                progress=False,
            )
        assert store.status().backfill["pending"] == 12, "nothing was committed"


def test_pending_chunks_lists_the_plan_in_order_and_skips_committed_ones(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "store", 20) as store:
        first_dims = TransformStored(lambda vectors: vectors[:, : NEW.dim])
        BackfillJob(store, NEW, first_dims, build_policy("ingest-order"), 6, progress=False).run(
            max_chunks=1
        )
        chunks = pending_chunks(store, store.active_backfill())
        assert [index for index, _ in chunks] == [1, 2, 3]
        assert [slots.tolist() for _, slots in chunks] == [
            list(range(6, 12)),
            list(range(12, 18)),
            [18, 19],
        ]
