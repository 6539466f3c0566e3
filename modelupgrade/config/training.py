"""params.yaml: ``architectures``, ``training`` and ``strategies`` sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from modelupgrade.config.base import Section


class PretrainedWeights(Section):
    """A local file of backbone weights (a timm state dict) a model starts from; nothing is
    downloaded. Keys the backbone lacks (a classifier head) are ignored and listed in the card;
    keys the backbone needs and the file lacks, or of another shape, are an error."""

    path: str
    # Checked before the file is read when given; the card records it either way.
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ArchitectureParams(Section):
    """An embedding model: a timm backbone, GeM pooling, linear embedding. The backbone starts
    from random weights (timm's pretrained=False), or from ``pretrained``, a local file."""

    backbone: str = "resnet18"
    # 3×3 stride-1 stem without max-pool (ResNet family) for 28×28 / 32×32 inputs.
    cifar_stem: bool = True
    # Side of the square input the backbone sees; images are resized to it. None:
    # the data's own size.
    image_size: int | None = Field(default=None, ge=8)
    embedding_dim: int = Field(default=128, ge=2)
    gem_p: float = Field(default=3.0, gt=0)
    gem_learnable: bool = False
    # A registered margin classifier (``modelupgrade.layers.CLASSIFIERS``; plugins checks it).
    classifier: str = "arcface"
    scale: float = Field(default=30.0, gt=0)
    margin: float = Field(default=0.3, ge=0)
    backbone_kwargs: dict[str, Any] = Field(default_factory=dict)
    pretrained: PretrainedWeights | None = None

    @model_serializer(mode="wrap")
    def _without_unset_pretrained(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out when unset, so that the cards, hashes and resume fingerprints of architectures
        # without one are what they were before the option existed.
        data = handler(self)
        if data.get("pretrained") is None:
            data.pop("pretrained", None)
        return data


class TrainingParams(Section):
    """SGD with momentum, per-step linear warm-up then cosine decay (DMU/BiCT: 0.1, 0.9, 1e-4)."""

    epochs: int = Field(default=2, ge=1)
    # SGD steps of every model, whatever its data size (epochs then follow from it): the old and
    # the new model of an upgrade get the same optimisation and differ in data or objective.
    # None: ``epochs`` passes over each model's own data.
    steps: int | None = Field(default=None, ge=1)
    # Warm-up steps under ``steps`` (None: ``warmup_epochs`` of the model's own data).
    warmup_steps: int | None = Field(default=None, ge=0)
    batch_size: int = Field(default=256, ge=2)
    lr: float = Field(default=0.1, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_epochs: float = Field(default=0.2, ge=0)
    warmup_start_ratio: float = Field(default=1e-3, gt=0, le=1)
    lr_min_ratio: float = Field(default=1e-2, ge=0, le=1)
    # Random resized crop (fraction of the area, aspect ratio range) and horizontal flip.
    crop_scale: tuple[float, float] = (0.8, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: bool = True
    # Batch size for embedding without augmentation (prototype refreshes, the embed stage).
    eval_batch_size: int = Field(default=1024, ge=1)
    # Keep the decoded uint8 training images on the GPU when they take at most this fraction
    # of its free memory.
    images_on_device_max_fraction: float = Field(default=0.5, ge=0, le=1)
    # torch CPU threads of the train/embed stages; None = torch's default (all cores). Tiny models
    # on a busy 2-core machine run several times faster with 1 (OpenMP threads otherwise spin-wait).
    cpu_threads: int | None = Field(default=None, ge=1)
    # Seconds between resume checkpoints (written at the end of an epoch); 0: after every epoch.
    # A step budget over a few hundred images makes epochs of a few steps, each too short to be
    # worth a checkpoint.
    checkpoint_seconds: float = Field(default=0.0, ge=0)
    # Steps between progress/NaN checks (each check synchronises with the GPU).
    log_every_steps: int = Field(default=10, ge=1)
    # torch.compile the model on CUDA (ignored on CPU): faster steps after a
    # compile of a minute or so.
    compile: bool = False

    @model_validator(mode="after")
    def _ranges_are_ordered(self) -> TrainingParams:
        for name in ("crop_scale", "crop_ratio"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(
                    f"training.{name} must be (low, high) with 0 < low <= high, got {(low, high)}"
                )
        if self.crop_scale[1] > 1:
            raise ValueError(
                "training.crop_scale is a fraction of the image area, at most 1; "
                f"got {self.crop_scale}"
            )
        return self


class StrategyParams(Section):
    """One compatibility strategy: its registered ``kind`` and that kind's hyper-parameters.

    ``options`` left out take the defaults of the paper that defines the kind (the ``Options`` class
    of each strategy in ``modelupgrade.strategies``); ``modelupgrade.params`` checks the kind and
    validates the options strictly against that class (the config imports none of the library).
    """

    kind: str
    options: dict[str, Any] = Field(default_factory=dict)
