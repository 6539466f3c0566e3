"""Data-parallel training under torchrun's environment follows the single-process loss trajectory.

Two gloo processes on the CPU train a tiny resnet10t (8 channels, 16×16 images) under RACT, whose
InfoNCE takes the new AND old embeddings of the whole batch as negatives, with separate augmented
views for the old model; one process trains the same model with the same global batch of 16.
Every epoch is one step (16 images, batch 16), so the history is the per-step loss.

Tolerance: with a batch-independent normalisation (GroupNorm over all channels) both runs compute
the same function of the same global batch, and only the order of float32 sums differs (DDP's
bucketed all-reduce, the gathered logits): the losses agree to 1e-4 relative over the 6 steps and
the final weights to 1e-4 absolute (measured: 4e-7 and 2e-5). Leaving out the gather of
negatives or the sharded augmentation moves the losses by 4e-2 and 7e-1 relative (measured).

BatchNorm is another function under DDP on the CPU: each process normalises its own 8 rows (torch
has no CPU SyncBatchNorm; on GPUs the engine converts to it), which moves the losses by tens of
percents within a few steps. There the test checks what DDP guarantees: both processes report the
same loss and end with the same parameters.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.models import EmbeddingModel, cpu_state
from modelupgrade.runtime import seed_everything
from modelupgrade.strategies import build_strategy
from modelupgrade.training import Trainer

WORLD_SIZE = 2
IMAGES, CLASSES, SIZE, STEPS = 16, 4, 16, 6
NORMALISATIONS = {"groupnorm": "groupnorm1", "batchnorm": None}
LOSS_RELATIVE_TOLERANCE = 1e-4
WEIGHT_ABSOLUTE_TOLERANCE = 1e-4
BATCHNORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def _architecture(norm_layer: str | None) -> ArchitectureParams:
    backbone_kwargs: dict[str, object] = {"channels": [8, 8, 8, 8], "stem_width": 8}
    if norm_layer is not None:
        backbone_kwargs["norm_layer"] = norm_layer
    return ArchitectureParams(
        backbone="resnet10t", cifar_stem=False, embedding_dim=8, backbone_kwargs=backbone_kwargs
    )


def _train(norm_layer: str | None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Generation 1 trained under RACT against a frozen generation 0: per-step losses, weights."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (IMAGES, 1, SIZE, SIZE), generator=generator, dtype=torch.uint8)
    labels = torch.arange(IMAGES) % CLASSES
    architecture = _architecture(norm_layer)
    seed_everything(1)
    old_model = EmbeddingModel(
        architecture, in_chans=1, num_classes=CLASSES, input_size=SIZE
    ).eval()
    seed_everything(2)
    new_model = EmbeddingModel(architecture, in_chans=1, num_classes=CLASSES, input_size=SIZE)
    params = TrainingParams(epochs=STEPS, batch_size=IMAGES, lr=0.05, warmup_epochs=0)
    strategy = build_strategy("ract", {"old_view": "separate"})
    result = Trainer(params, "cpu", seed=3, progress=False).fit(
        new_model, images, labels, strategy, old_model
    )
    assert result.world_size == int(os.environ.get("WORLD_SIZE", "1"))
    return [epoch["loss"] for epoch in result.history], cpu_state(new_model)


def _train_as_torchrun_rank(rank: int, port: int, out: str) -> None:
    """One torchrun process: its place in the environment, the engine joins the group itself."""
    os.environ.update(
        WORLD_SIZE=str(WORLD_SIZE),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    runs = {name: _train(norm) for name, norm in NORMALISATIONS.items()}
    torch.distributed.destroy_process_group()
    torch.save(runs, Path(out, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


Run = tuple[list[float], dict[str, torch.Tensor]]


@pytest.fixture(scope="module")
def data_parallel_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Run]]:
    """Both normalisations trained by 2 processes, in one spawn (starting processes is slow)."""
    out = tmp_path_factory.mktemp("ddp")
    torch.multiprocessing.spawn(
        _train_as_torchrun_rank, args=(_free_port(), str(out)), nprocs=WORLD_SIZE
    )
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]


def _the_processes_are_replicas(runs: list[Run]) -> None:
    """Equal losses and parameters. BatchNorm statistics are not compared: each process updates its
    own from its rows, and DDP copies rank 0's into the others at the next forward pass; rank 0's
    are the ones saved."""
    (losses, weights), (other_losses, other_weights) = runs
    assert losses == other_losses, "every process reports the global batch's loss"
    parameters = [name for name in weights if not name.endswith(BATCHNORM_STATISTICS)]
    assert all(torch.equal(weights[name], other_weights[name]) for name in parameters), (
        "DDP keeps the replicas equal"
    )


def test_two_gloo_processes_follow_the_single_process_loss_per_step(
    data_parallel_runs: list[dict[str, Run]],
) -> None:
    _the_processes_are_replicas([runs["groupnorm"] for runs in data_parallel_runs])
    losses, weights = data_parallel_runs[0]["groupnorm"]
    single_losses, single_weights = _train(NORMALISATIONS["groupnorm"])
    single, parallel = (
        torch.tensor(single_losses, dtype=torch.float64),
        torch.tensor(losses, dtype=torch.float64),
    )
    assert len(single) == STEPS and single[-1] < 0.6 * single[0], "the model must be learning"
    loss_gap = ((parallel - single).abs() / single).max().item()
    weight_gap = max(
        (weights[name].float() - single_weights[name].float()).abs().max().item()
        for name in weights
    )
    print(
        f"\nsingle process {single_losses}\n2 processes    {losses}\n"
        f"max relative loss gap {loss_gap:.2e}, max absolute weight gap {weight_gap:.2e}"
    )
    assert loss_gap <= LOSS_RELATIVE_TOLERANCE
    assert weight_gap <= WEIGHT_ABSOLUTE_TOLERANCE


def test_with_batchnorm_on_cpu_the_processes_stay_replicas(
    data_parallel_runs: list[dict[str, Run]],
) -> None:
    runs = [runs["batchnorm"] for runs in data_parallel_runs]
    _the_processes_are_replicas(runs)
    losses, weights = runs[0]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert any(name.endswith("running_var") for name in weights), (
        "the backbone normalises with BatchNorm"
    )


def test_a_global_batch_that_does_not_split_over_the_processes_is_refused() -> None:
    from modelupgrade.errors import UserError
    from modelupgrade.training.distributed import DataParallel

    with pytest.raises(UserError, match="multiple of torchrun's --nproc_per_node"):
        DataParallel(rank=1, world_size=3).local_rows(16)
    assert DataParallel(rank=1, world_size=2).local_rows(16) == slice(8, 16)


def test_without_torchrun_the_engine_stays_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from modelupgrade.training.distributed import join_process_group

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    joined = join_process_group("cpu")
    assert (joined.rank, joined.world_size, joined.enabled) == (0, 1, False)
    assert not torch.distributed.is_initialized()
    features = torch.ones(3, 2, requires_grad=True)
    assert joined.gather(features) is features and joined.average(features) is features


def test_a_world_size_without_the_rest_of_torchruns_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modelupgrade.errors import UserError
    from modelupgrade.training.distributed import TORCHRUN_VARIABLES, join_process_group

    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set"):
        join_process_group("cpu")


def test_each_process_draws_the_crops_of_its_rows_of_the_global_batch() -> None:
    from modelupgrade.training.distributed import DataParallel

    augmentation = ((0.5, 1.0), (0.75, 1.33), True)
    single = (
        DataParallel()
        .augmentation(*augmentation)
        .crop_parameters(8, torch.Generator().manual_seed(5))
    )
    shards = [
        DataParallel(rank, 2)
        .augmentation(*augmentation)
        .crop_parameters(4, torch.Generator().manual_seed(5))
        for rank in range(2)
    ]
    assert torch.equal(torch.cat(shards), single)
