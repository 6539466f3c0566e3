"""The embedding model: timm backbone → GeM → linear embedding → L2
normalisation, plus a classifier."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.layers import GeM, MarginClassifier, build_classifier
from modelupgrade.models.backbone import create_backbone, probe_feature_shape
from modelupgrade.models.card import ModelCard

# Images are scaled to [0, 1] and then to [-1, 1]; the models are trained from scratch, so
# dataset-specific statistics buy nothing and would tie a checkpoint to one dataset.
PIXEL_MEAN = 0.5
PIXEL_STD = 0.5


class EmbeddingModel(nn.Module):
    """``forward(images) -> (N, D)`` L2-normalised embeddings; ``classifier`` trains them.

    ``images`` may be uint8 (0..255) or float in [0, 1], with 1 or 3 channels and any square size:
    the model converts them to its own channel count and input size, so that an old and a new model
    of different architectures can embed the same batch.
    """

    card: ModelCard  # the card it was loaded from (``load_model``)

    def __init__(
        self, architecture: ArchitectureParams, in_chans: int, num_classes: int, input_size: int
    ) -> None:
        super().__init__()
        if in_chans not in (1, 3):
            raise UserError(f"images must have 1 or 3 channels, got {in_chans}")
        self.architecture = architecture
        self.in_chans = in_chans
        self.input_size = architecture.image_size or input_size
        self.backbone, channels = create_backbone(
            architecture.backbone, in_chans, architecture.cifar_stem, architecture.backbone_kwargs
        )
        probe_feature_shape(self.backbone, in_chans, self.input_size)
        self.pool = GeM(p=architecture.gem_p, learnable=architecture.gem_learnable)
        self.embedding = nn.Linear(channels, architecture.embedding_dim)
        self.classifier: MarginClassifier = build_classifier(
            architecture.classifier,
            architecture.embedding_dim,
            num_classes,
            scale=architecture.scale,
            margin=architecture.margin,
        )
        # Labels seen in training (the classifier rows that mean something); None = all rows.
        self.trained_classes: list[int] | None = None
        # The pretrained weights file the backbone started from, as the card records it.
        self.initialised_from: dict[str, object] | None = None

    @property
    def embedding_dim(self) -> int:
        return self.embedding.out_features

    @property
    def num_classes(self) -> int:
        return self.classifier.num_classes

    def prepare_inputs(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float images → normalised float at this model's channels and size."""
        x = resized_unit_images(images, self.in_chans, self.input_size)
        x = (x - PIXEL_MEAN) / PIXEL_STD
        return x.contiguous(memory_format=torch.channels_last)

    def unnormalised(self, images: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.pool(self.backbone(self.prepare_inputs(images))))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.unnormalised(images).float(), dim=-1)


def resized_unit_images(images: torch.Tensor, in_chans: int, input_size: int) -> torch.Tensor:
    """uint8 or [0, 1] float images (N, C, H, W) as [0, 1] float with ``in_chans`` channels,
    resized bilinearly to ``input_size`` × ``input_size``."""
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    if x.shape[1] != in_chans:
        # Grey → colour repeats the channel; colour → grey uses the ITU-R 601 luma weights.
        if x.shape[1] == 1:
            x = x.expand(-1, in_chans, -1, -1)
        elif x.shape[1] == 3 and in_chans == 1:
            luma = torch.tensor([0.299, 0.587, 0.114], device=x.device).view(1, 3, 1, 1)
            x = (x * luma).sum(dim=1, keepdim=True)
        else:
            raise UserError(
                f"cannot feed {x.shape[1]}-channel images to a {in_chans}-channel model"
            )
    if x.shape[-2:] != (input_size, input_size):
        x = F.interpolate(
            x, size=(input_size, input_size), mode="bilinear", align_corners=False, antialias=False
        )
    return x
