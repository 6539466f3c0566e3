"""Data-parallel training under ``torchrun``: N processes follow the single-process trajectory.

``torchrun --nproc_per_node N -m stages.train ...`` starts N copies of the stage and tells each its
place through WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. The training engine calls
``join_process_group`` once; under torchrun it joins the process group (NCCL on GPUs, gloo on CPU)
and returns a ``DataParallel`` whose helpers make the N processes compute what one process computes
with the same global batch:

- every process draws the same epoch permutation and the same augmentation parameters for the whole
  global batch (their generators are seeded alike) and keeps its own contiguous rows: the sharding
  of ``DistributedSampler``, without a sampler, since the engine indexes one uint8 tensor;
- the model is wrapped in ``DistributedDataParallel``, which averages the gradients; on GPUs its
  BatchNorm layers become ``SyncBatchNorm``, so the batch statistics are the global batch's (torch
  has no CPU SyncBatchNorm: on CPU each process normalises its own rows);
- the compatibility terms see the whole global batch: labels, new and old embeddings are
  all-gathered, the new ones with their gradient, so contrastive negatives, DMU's batch softmax and
  every other batch-level statistic are the single-process run's;
- only rank 0 shows progress, logs epochs and writes checkpoints and the model.

Without torchrun (no WORLD_SIZE, or WORLD_SIZE=1, and no process group) ``DataParallel`` describes
the one process and every helper returns its input unchanged.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from modelupgrade.errors import UserError
from modelupgrade.training.augment import BatchAugment

log = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class ShardedAugment(BatchAugment):
    """``BatchAugment`` for one process's rows of the global batch.

    The crop parameters of the whole global batch are drawn, as one process would draw them, and
    this process keeps its own rows: every image gets the crop it gets in a single-process run, and
    the generator advances alike in every process, so the next draw agrees too.
    """

    def __init__(
        self,
        crop_scale: tuple[float, float],
        crop_ratio: tuple[float, float],
        hflip: bool,
        rank: int,
        world_size: int,
    ) -> None:
        super().__init__(crop_scale, crop_ratio, hflip)
        self.rank, self.world_size = rank, world_size

    def crop_parameters(self, n: int, generator: torch.Generator) -> torch.Tensor:
        global_batch = super().crop_parameters(n * self.world_size, generator)
        return global_batch[self.rank * n : (self.rank + 1) * n]


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the training processes, and the collectives the engine uses."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    def local_rows(self, global_batch: int) -> slice:
        """This process's contiguous rows of a global batch."""
        if global_batch % self.world_size:
            raise UserError(
                f"the global batch of {global_batch} images does not split evenly over "
                f"{self.world_size} training processes",
                hint="set training.batch_size to a multiple of torchrun's --nproc_per_node "
                "(× --nnodes)",
            )
        per_process = global_batch // self.world_size
        return slice(self.rank * per_process, (self.rank + 1) * per_process)

    def augmentation(
        self, crop_scale: tuple[float, float], crop_ratio: tuple[float, float], hflip: bool
    ) -> BatchAugment:
        if not self.enabled:
            return BatchAugment(crop_scale, crop_ratio, hflip)
        return ShardedAugment(crop_scale, crop_ratio, hflip, self.rank, self.world_size)

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to run the forward pass through: ``model`` itself, or its DDP wrapper.

        SyncBatchNorm layers share their parameters and buffers with the BatchNorm layers they
        replace, so the optimiser built on ``model`` still holds the right tensors; in eval mode
        they normalise like BatchNorm, and their state dict has the same keys.
        """
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        if self.device.type == "cuda":
            from timm.layers import convert_sync_batchnorm

            return DistributedDataParallel(
                convert_sync_batchnorm(model), device_ids=[self.device.index]
            )
        if self.is_primary and any(isinstance(module, _BATCHNORMS) for module in model.modules()):
            log.warning(
                "BatchNorm layers normalise each process's own rows on the CPU (torch has no CPU "
                "SyncBatchNorm): this run is not the single-process run, as it is on GPUs"
            )
        return DistributedDataParallel(model)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The rows of every process, in rank order (the global batch); gradients flow back.

        Every process computes the compatibility terms on the gathered batch, so the backward pass
        of the gather sums N copies of each row's gradient into the process that owns the row, and
        DDP's averaging divides by N again: the update is the single-process one.
        """
        if not self.enabled:
            return tensor
        # The functional collective is the autograd-aware all-gather that torch.distributed.nn's
        # deprecation notice points to.
        from torch.distributed import _functional_collectives as collectives

        world = dist.group.WORLD
        assert world is not None  # enabled: the process group is initialised
        gathered = collectives.all_gather_single(tensor.contiguous(), 0, world)
        return (
            gathered.wait() if isinstance(gathered, collectives.AsyncCollectiveTensor) else gathered
        )

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of ``tensor`` over the processes (no gradient)."""
        if not self.enabled:
            return tensor
        total = tensor.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def average_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Average the gradients of parameters that DDP does not manage (a strategy's own ψ)."""
        if not self.enabled:
            return
        for parameter in parameters:
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
                parameter.grad.div_(self.world_size)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def _process_device(device: torch.device) -> torch.device:
    """torchrun's one-GPU-per-process convention: a CUDA device becomes ``cuda:LOCAL_RANK``."""
    if device.type != "cuda":
        return device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        raise UserError(
            f"training process {local_rank} of this node has no GPU: "
            f"{torch.cuda.device_count()} visible",
            hint="start at most one process per GPU (torchrun --nproc_per_node ≤ the GPU count)",
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def current(device: torch.device | str = "cpu") -> DataParallel:
    """The place of this process in the process group already joined (or the single process)."""
    device = torch.device(device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return DataParallel(device=device)
    return DataParallel(dist.get_rank(), dist.get_world_size(), _process_device(device))


def join_process_group(device: torch.device | str) -> DataParallel:
    """Join torchrun's process group if this process is one of several; describe its place."""
    device = torch.device(device)
    if dist.is_available() and dist.is_initialized():
        return current(device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DataParallel(device=device)
    if not dist.is_available():
        raise UserError(
            f"WORLD_SIZE is {world_size}, but this torch build has no torch.distributed"
        )
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise UserError(
            f"WORLD_SIZE is {world_size}, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set",
            hint="start multi-process training with torchrun --nproc_per_node N: it sets them all",
        )
    device = _process_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    atexit.register(_leave_process_group)
    joined = current(device)
    if joined.is_primary:
        log.info(
            "data-parallel training: %d processes (%s), this one on %s", world_size, backend, device
        )
    return joined


def _leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
