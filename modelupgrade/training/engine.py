"""The training engine: one loop for generation 0 and for every new generation under a strategy.

- Images are decoded once into a uint8 tensor, kept on the GPU when they fit, augmented per batch
  with tensor ops (``BatchAugment``).
- The old model is frozen (eval mode, no gradient); it embeds the same batch (the same augmented
  view, or its own view when the strategy asks for one).
- SGD with momentum; per-step warm-up then cosine schedule; bf16 autocast on GPU; channels_last
  everywhere (on the CPU too, where it is faster at these sizes).
- Deterministic on CPU for a seed: the epoch's permutation and augmentation draws come from
  generators seeded by (seed, epoch), so a run resumed from an epoch checkpoint continues exactly.
- A checkpoint (model, strategy, optimiser, history) is written atomically after every epoch; a run
  started again with the same resume directory continues after the last finished epoch.
- A non-finite loss stops the run with a ``TrainingDivergedError`` naming the epoch and step.
- Under ``torchrun --nproc_per_node N`` each process trains on its rows of every global batch
  (``modelupgrade.training.distributed``): DDP, compatibility terms on the all-gathered batch,
  rank 0 alone logging and checkpointing. One process without torchrun is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from modelupgrade.config.training import TrainingParams
from modelupgrade.errors import UserError
from modelupgrade.models import (
    EmbeddingModel,
    autocast_for,
    cpu_state,
    embed_tensor,
    runs_on_images,
)
from modelupgrade.runtime import enable_determinism, seed_everything
from modelupgrade.schedule import learning_rate
from modelupgrade.strategies import CompatibilityStrategy, StepInputs, TrainingContext
from modelupgrade.training.augment import BatchAugment

if TYPE_CHECKING:
    from modelupgrade.training.distributed import DataParallel

log = logging.getLogger(__name__)

RESUME_FILE = "resume.pt"


class TrainingDivergedError(UserError):
    """The loss became NaN or infinite."""


@dataclass
class TrainingResult:
    # One record per epoch: its number, mean loss (and each term's), steps, learning rate, time.
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    images_per_second: float = 0.0
    steps: int = 0
    resumed_from_epoch: int = 0
    images_on_device: bool = False
    world_size: int = 1


def place_images(images: torch.Tensor, device: torch.device, max_fraction: float) -> torch.Tensor:
    """Put the uint8 images on the GPU if they take at most ``max_fraction`` of its free memory."""
    if device.type != "cuda":
        return images
    free, _ = torch.cuda.mem_get_info(device)
    if images.numel() * images.element_size() <= max_fraction * free:
        return images.to(device)
    log.info("training images (%.1f GiB) stay in pinned host memory", images.numel() / 2**30)
    return images.pin_memory()


def _fingerprint(
    model: EmbeddingModel,
    strategy: CompatibilityStrategy,
    params: TrainingParams,
    seed: int,
    n: int,
) -> str:
    description = {
        "architecture": model.architecture.model_dump(mode="json"),
        "classes": model.num_classes,
        "strategy": strategy.describe(),
        "training": params.model_dump(mode="json"),
        "seed": seed,
        "images": n,
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrainingPlan:
    """How many SGD steps a run takes and how they fall into epochs of its data.

    ``training.steps`` gives every model the same number of steps whatever its data size (the old
    and the new model of an upgrade then differ in data, not in optimisation); without it a run
    takes ``training.epochs`` passes. The last epoch of a step budget can be a part of one."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @classmethod
    def of(cls, params: TrainingParams, n: int, batch_size: int) -> TrainingPlan:
        steps_per_epoch = max(1, n // batch_size)
        if params.steps is None:
            total = steps_per_epoch * params.epochs
            warmup = round(params.warmup_epochs * steps_per_epoch)
        else:
            total = params.steps
            warmup = (
                params.warmup_steps
                if params.warmup_steps is not None
                else round(params.warmup_epochs * steps_per_epoch)
            )
        return cls(steps_per_epoch, total, min(warmup, total))

    @property
    def epochs(self) -> int:
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def steps_in_epoch(self, epoch: int) -> int:
        return min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch)


def _check_training_data(model: EmbeddingModel, images: torch.Tensor, labels: torch.Tensor) -> None:
    """Refuse images that are not a uint8 (N, C, H, W) tensor of at least two, or labels that do
    not name one of the model's classes per image."""
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise UserError(
            f"training images must be a uint8 (N, C, H, W) tensor, got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    n = images.shape[0]
    if n < 2:
        raise UserError(f"training needs at least 2 images, got {n}")
    if labels.shape != (n,):
        raise UserError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    if int(labels.max()) >= model.num_classes:
        raise UserError(
            f"label {int(labels.max())} is out of range for a {model.num_classes}-class model"
        )


@dataclass(frozen=True)
class _FitRun:
    """What one fit sets up once: the models and the strategy, the data on the process's device,
    the step plan, the optimiser, and how each step draws its views."""

    model: EmbeddingModel
    strategy: CompatibilityStrategy
    context: TrainingContext
    data_parallel: DataParallel
    images: torch.Tensor
    labels: torch.Tensor
    plan: TrainingPlan
    batch_size: int  # the global batch
    local_rows: slice  # this process's rows of every global batch
    optimizer: torch.optim.Optimizer
    strategy_trainable: list[torch.nn.Parameter]
    step_old_model: EmbeddingModel | None  # the old model each step runs, if the strategy asks
    augment: BatchAugment
    separate_old_view: bool  # the old model sees its own augmented view of the batch

    @property
    def device(self) -> torch.device:
        return self.data_parallel.device

    @property
    def n(self) -> int:
        return int(self.images.shape[0])


@dataclass
class _Progress:
    """A fit's progress bar and its running counts: images trained, when it started, when the last
    resume checkpoint was written."""

    bar: tqdm
    started: float = field(default_factory=time.perf_counter)
    last_checkpoint: float = field(default_factory=time.perf_counter)
    trained_images: int = 0

    def show(self, step: int, loss: float) -> None:
        elapsed = time.perf_counter() - self.started
        self.bar.update(step + 1 - self.bar.n)
        self.bar.set_postfix(
            loss=f"{loss:.3f}",
            img_s=f"{self.trained_images / max(elapsed, 1e-9):.0f}",
            refresh=False,
        )


def _train_step(
    run: _FitRun,
    forward_model: Callable[..., torch.Tensor],
    global_rows: torch.Tensor,
    generator: torch.Generator,
    epoch: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One SGD step on this process's rows of the global batch ``global_rows``: the classification
    loss and the strategy's terms (on the all-gathered batch); returns the loss and its terms."""
    index = global_rows[run.local_rows].to(run.images.device)
    batch = run.images.index_select(0, index).to(run.device, non_blocking=True)
    batch_labels = run.labels.index_select(0, index.to(run.device))
    new_view = run.augment(batch, generator)
    old_view = run.augment(batch, generator) if run.separate_old_view else new_view
    with autocast_for(run.device):
        new_features = forward_model(new_view)
        old_features = None
        if run.step_old_model is not None:
            with torch.no_grad():
                old_features = run.step_old_model(old_view).detach()
        terms = {"classification": run.model.classifier.loss(new_features, batch_labels)}
        gather = run.data_parallel.gather
        global_batch = StepInputs(
            gather(batch_labels),
            gather(new_features),
            None if old_features is None else gather(old_features),
            run.model,
            epoch,
        )
        terms.update(run.strategy.losses(global_batch))
    loss = torch.stack([t.float() for t in terms.values()]).sum()
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    run.data_parallel.average_gradients(run.strategy_trainable)
    run.optimizer.step()
    return loss, terms


class Trainer:
    def __init__(
        self,
        params: TrainingParams,
        device: torch.device | str = "cpu",
        seed: int = 0,
        resume_dir: str | Path | None = None,
        progress: bool | None = None,
        description: str = "train",
    ) -> None:
        self.params = params
        self.device = torch.device(device)
        self.seed = seed
        self.resume_dir = Path(resume_dir) if resume_dir is not None else None
        self.progress = progress
        self.description = description

    def fit(
        self,
        model: EmbeddingModel,
        images: torch.Tensor,
        labels: torch.Tensor,
        strategy: CompatibilityStrategy,
        old_model: EmbeddingModel | None = None,
        old_training_features: torch.Tensor | None = None,
    ) -> TrainingResult:
        """Train ``model`` in place on uint8 ``images`` (N, C, H, W) and int64 ``labels`` (N,).

        ``params.batch_size`` is the global batch: under torchrun each process trains on its share.
        ``old_training_features`` (N, D_old), when given, are the old embeddings of ``images``
        (an embeddings-only old model's vectors), used instead of running the old model on them.
        """
        _check_training_data(model, images, labels)
        run = self._set_up(model, images, labels, strategy, old_model, old_training_features)
        result = TrainingResult(
            images_on_device=run.images.device.type == run.device.type,
            world_size=run.data_parallel.world_size,
        )
        fingerprint = _fingerprint(model, strategy, self.params, self.seed, run.n)
        start_epoch = self._maybe_resume(fingerprint, model, strategy, run.optimizer, result)
        # Wrapped after resuming: DDP takes the parameters as they are when it wraps the model.
        forward_model: Callable[..., torch.Tensor] = run.data_parallel.wrap(model)
        if self.params.compile and run.device.type == "cuda":
            forward_model = torch.compile(forward_model)
        progress = _Progress(self._progress_bar(run, start_epoch))
        try:
            for epoch in range(start_epoch, run.plan.epochs):
                result.history.append(self._train_epoch(run, forward_model, epoch, progress))
                if run.data_parallel.is_primary:
                    self._after_epoch(run, epoch, fingerprint, result, progress)
        finally:
            progress.bar.close()
        total_steps = run.plan.total_steps
        result.seconds = time.perf_counter() - progress.started
        result.steps = total_steps - min(total_steps, start_epoch * run.plan.steps_per_epoch)
        result.images_per_second = progress.trained_images / max(result.seconds, 1e-9)
        model.eval()
        strategy.eval()
        return result

    def _set_up(
        self,
        model: EmbeddingModel,
        images: torch.Tensor,
        labels: torch.Tensor,
        strategy: CompatibilityStrategy,
        old_model: EmbeddingModel | None,
        old_training_features: torch.Tensor | None,
    ) -> _FitRun:
        """Join the process group, seed, put the data and the models on the device, set the
        strategy up and build the optimiser over the model's and the strategy's parameters."""
        # Imported here: torch.distributed loads only when a model is trained.
        from modelupgrade.training.distributed import join_process_group

        p = self.params
        data_parallel = join_process_group(self.device)
        device = data_parallel.device
        seed_everything(self.seed)
        if device.type == "cpu":
            enable_determinism()
        else:
            # Fixed input shapes every step: let cuDNN pick the fastest convolution algorithms once.
            torch.backends.cudnn.benchmark = True
        images = place_images(images, device, p.images_on_device_max_fraction)
        labels = labels.to(device)
        # channels_last on the CPU too: its max-pool and convolutions run ~1.3x faster per image
        # there than in NCHW (measured on the 2-core machine, the default network at 28x28).
        model.to(device).to(memory_format=torch.channels_last)
        if old_model is not None and runs_on_images(old_model):
            old_model.to(device).eval().requires_grad_(False)
            old_model.to(memory_format=torch.channels_last)
        n = images.shape[0]
        batch_size = min(p.batch_size, n)
        plan = TrainingPlan.of(p, n, batch_size)
        context = TrainingContext(
            labels=labels,
            epochs=plan.epochs,
            embed_training_set=lambda m: embed_tensor(m, images, p.eval_batch_size, device),
            old_model=old_model if strategy.needs_old_model else None,
            _old_features=None
            if old_training_features is None
            else old_training_features.to(device).float(),
        )
        strategy.setup(model, context)
        strategy.to(device)
        strategy_trainable = [q for q in strategy.parameters() if q.requires_grad]
        trainable = [q for q in model.parameters() if q.requires_grad] + strategy_trainable
        return _FitRun(
            model=model,
            strategy=strategy,
            context=context,
            data_parallel=data_parallel,
            images=images,
            labels=labels,
            plan=plan,
            batch_size=batch_size,
            local_rows=data_parallel.local_rows(batch_size),
            optimizer=torch.optim.SGD(
                trainable, lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay
            ),
            strategy_trainable=strategy_trainable,
            # Only a strategy that compares each batch with the old model runs it on every step.
            step_old_model=context.old_model if strategy.runs_old_model else None,
            augment=data_parallel.augmentation(p.crop_scale, p.crop_ratio, p.hflip),
            separate_old_view=strategy.options.old_view == "separate",
        )

    def _progress_bar(self, run: _FitRun, start_epoch: int) -> tqdm:
        return tqdm(
            total=run.plan.total_steps,
            initial=start_epoch * run.plan.steps_per_epoch,
            desc=self.description,
            disable=not run.data_parallel.is_primary
            or (None if self.progress is None else not self.progress),
            mininterval=1.0,
            dynamic_ncols=True,
        )

    def _train_epoch(
        self,
        run: _FitRun,
        forward_model: Callable[..., torch.Tensor],
        epoch: int,
        progress: _Progress,
    ) -> dict[str, float]:
        """One epoch of SGD steps over a permutation drawn from (seed, epoch); returns its record
        in the history."""
        p, plan, device = self.params, run.plan, run.device
        run.model.train()
        run.strategy.train()
        run.strategy.on_epoch_start(epoch, run.model, run.context)
        run.model.train()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(run.n, generator=generator)[: plan.steps_per_epoch * run.batch_size]
        order = order.view(plan.steps_per_epoch, run.batch_size)
        # The last epoch of a step budget can be a part of one.
        epoch_steps = plan.steps_in_epoch(epoch)
        epoch_losses = torch.zeros(epoch_steps, device=device)
        term_sums: dict[str, torch.Tensor] = {}
        epoch_started = time.perf_counter()
        checked = 0
        lr = p.lr
        for step_in_epoch in range(epoch_steps):
            step = epoch * plan.steps_per_epoch + step_in_epoch
            lr = learning_rate(
                step,
                plan.total_steps,
                plan.warmup_steps,
                p.lr,
                p.warmup_start_ratio,
                p.lr_min_ratio,
            )
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            loss, terms = _train_step(run, forward_model, order[step_in_epoch], generator, epoch)
            epoch_losses[step_in_epoch] = loss.detach()
            for name, value in terms.items():
                term_sums[name] = term_sums.get(name, 0.0) + value.detach().float()
            progress.trained_images += run.batch_size
            last = step_in_epoch == epoch_steps - 1
            if (step_in_epoch + 1) % p.log_every_steps == 0 or last or device.type == "cpu":
                # From here on the losses are the global batch's: the mean over the processes.
                done = step_in_epoch + 1
                epoch_losses[checked:done] = run.data_parallel.average(epoch_losses[checked:done])
                checked = self._check_finite(
                    epoch_losses, checked, done, epoch, plan.steps_per_epoch
                )
                progress.show(step, float(epoch_losses[step_in_epoch]))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - epoch_started
        averaged = run.data_parallel.average(torch.stack(list(term_sums.values())))
        term_means = {k: float(v) / epoch_steps for k, v in zip(term_sums, averaged, strict=True)}
        return {
            "epoch": epoch,
            "loss": float(epoch_losses.mean()),
            **{f"loss_{k}": v for k, v in term_means.items()},
            "steps": epoch * plan.steps_per_epoch + epoch_steps,
            "lr_end": lr,
            "seconds": round(seconds, 3),
            "images_per_second": round(epoch_steps * run.batch_size / max(seconds, 1e-9), 1),
        }

    def _after_epoch(
        self,
        run: _FitRun,
        epoch: int,
        fingerprint: str,
        result: TrainingResult,
        progress: _Progress,
    ) -> None:
        """Log the epoch's record and write the resume checkpoint when it is due (the primary
        process only)."""
        epochs = run.plan.epochs
        # About ten lines a run, however many short epochs a step budget makes.
        logged = (epoch + 1) % max(1, epochs // 10) == 0 or epoch == 0
        log.log(
            logging.INFO if logged else logging.DEBUG,
            "%s epoch %d/%d: %s",
            self.description,
            epoch + 1,
            epochs,
            result.history[-1],
        )
        if time.perf_counter() - progress.last_checkpoint >= self.params.checkpoint_seconds:
            self._save_resume(
                fingerprint, epoch + 1, run.model, run.strategy, run.optimizer, result
            )
            progress.last_checkpoint = time.perf_counter()

    def _check_finite(
        self, losses: torch.Tensor, checked: int, upto: int, epoch: int, steps_per_epoch: int
    ) -> int:
        window = losses[checked:upto]
        bad = torch.nonzero(~torch.isfinite(window))
        if bad.numel():
            local = checked + int(bad[0, 0])
            raise TrainingDivergedError(
                f"the training loss became {float(losses[local])} at epoch {epoch + 1}, step "
                f"{local + 1} of {steps_per_epoch} (global step "
                f"{epoch * steps_per_epoch + local + 1})",
                hint="lower training.lr or raise training.warmup_epochs; check the "
                "strategy's loss weights",
            )
        return upto

    # ------------------------------------------------------------------ resume

    def _resume_path(self) -> Path | None:
        return self.resume_dir / RESUME_FILE if self.resume_dir is not None else None

    def _maybe_resume(
        self,
        fingerprint: str,
        model: EmbeddingModel,
        strategy: CompatibilityStrategy,
        optimizer: torch.optim.Optimizer,
        result: TrainingResult,
    ) -> int:
        path = self._resume_path()
        if path is None or not path.is_file():
            return 0
        # Loaded to the CPU: load_state_dict copies each tensor onto its parameter's device, which
        # under torchrun is this process's own GPU, not the one self.device names.
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("fingerprint") != fingerprint:
            log.warning("ignoring %s: it was written for a different configuration or data", path)
            return 0
        model.load_state_dict(state["model"])
        strategy.load_state_dict(state["strategy"])
        optimizer.load_state_dict(state["optimizer"])
        result.history = json.loads(state["history"])
        result.resumed_from_epoch = int(state["epoch"])
        log.info(
            "resuming %s after epoch %d from %s", self.description, result.resumed_from_epoch, path
        )
        return result.resumed_from_epoch

    def _save_resume(
        self,
        fingerprint: str,
        epoch: int,
        model: EmbeddingModel,
        strategy: CompatibilityStrategy,
        optimizer: torch.optim.Optimizer,
        result: TrainingResult,
    ) -> None:
        path = self._resume_path()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "fingerprint": fingerprint,
            "epoch": epoch,
            "model": cpu_state(model),
            "strategy": cpu_state(strategy),
            "optimizer": optimizer.state_dict(),
            "history": json.dumps(result.history),
        }
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
