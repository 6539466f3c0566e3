"""The modules an adopted model becomes: a network made elsewhere behind the embedding-model
interface (``AdoptedNetwork``), or the vectors an old model gave known items
(``PrecomputedEmbeddings``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelupgrade.errors import UserError
from modelupgrade.models.card import PreprocessingCard
from modelupgrade.models.embedding import resized_unit_images


class AdoptedNetwork(nn.Module):
    """A network made elsewhere behind the embedding-model interface: images → its
    preprocessing → its output, L2-normalised. It has no classifier."""

    runs_on_images = True
    mean: torch.Tensor  # buffers: the preprocessing's per-channel normalisation
    std: torch.Tensor

    def __init__(self, network: nn.Module, preprocessing: PreprocessingCard, dim: int) -> None:
        super().__init__()
        self.network = network
        self.in_chans = preprocessing.channels
        self.input_size = preprocessing.input_size
        self.classifier: nn.Module | None = None
        self.trained_classes: list[int] | None = None
        self._dim = dim
        shape = (1, preprocessing.channels, 1, 1)
        self.register_buffer("mean", torch.tensor(preprocessing.mean).view(shape), False)
        self.register_buffer("std", torch.tensor(preprocessing.std).view(shape), False)

    @property
    def embedding_dim(self) -> int:
        return self._dim

    @property
    def num_classes(self) -> int:
        return 0

    def prepare_inputs(self, images: torch.Tensor) -> torch.Tensor:
        x = resized_unit_images(images, self.in_chans, self.input_size)
        return (x - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.network(self.prepare_inputs(images)).float(), dim=-1)


class PrecomputedEmbeddings(nn.Module):
    """An old model that can no longer run: the L2-normalised vectors it gave known items."""

    runs_on_images = False
    vectors: torch.Tensor  # a buffer: (items, dim)

    def __init__(self, vectors: torch.Tensor, item_ids: Sequence[str], source: str) -> None:
        super().__init__()
        self.register_buffer("vectors", vectors.float())
        self.row_of = {item: row for row, item in enumerate(item_ids)}
        self.source = source
        self.classifier: nn.Module | None = None
        self.trained_classes: list[int] | None = None

    @property
    def embedding_dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def num_classes(self) -> int:
        return 0

    def rows(self, item_ids: Sequence[str], split: str) -> np.ndarray:
        """The table rows of ``item_ids``; an item without a vector is an error naming ``split``."""
        missing = [item for item in item_ids if item not in self.row_of]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" …" if len(missing) > 5 else "")
            raise UserError(
                f"the embeddings of {self.source} lack {len(missing)} of the {len(item_ids)} "
                f"images of split {split} ({shown})",
                hint="an embeddings-only model can only give the vectors it holds: add the "
                "missing items to the table and adopt it again",
            )
        return np.fromiter((self.row_of[item] for item in item_ids), np.int64, len(item_ids))

    def lookup(self, item_ids: Sequence[str], split: str) -> torch.Tensor:
        """The vectors of ``item_ids`` (rows in their order), float32 (N, D)."""
        return self.vectors[torch.from_numpy(self.rows(item_ids, split))]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        raise UserError(
            f"{self.source} is an embeddings-only model: it cannot embed images",
            hint="use it where its precomputed vectors are looked up by item id (embed, training "
            "strategies that need only the old embeddings of the training images, the store)",
        )


def runs_on_images(model: nn.Module) -> bool:
    """Whether ``model`` embeds images (an embeddings-only model only looks vectors up)."""
    return bool(getattr(model, "runs_on_images", True))
