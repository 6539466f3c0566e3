"""What every form of a model made elsewhere shares: the source interface (``ModelSource``) and
its registry (``MODEL_SOURCES``), the adoption it yields, and the probe that measures a network's
embedding dimension and holds it to the one declared."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import torch
from pydantic import ValidationError
from torch import nn

from modelupgrade.errors import UserError, not_valid
from modelupgrade.models.adoption_options import SourceOptions
from modelupgrade.models.card import ModelCard, PreprocessingCard
from modelupgrade.plugins import Registry

# How many images a network's output shape is probed with (more than one: a squeeze would hide).
PROBE_IMAGES = 2


class AdoptedEntries(TypedDict, total=False):
    """What an adoption knows of the model beyond its module: entries of the card's ``adopted``
    (``AdoptedCard``), and the splits whose vectors it checked (the card's ``data``)."""

    preprocessing: PreprocessingCard
    ignored_keys: list[str]
    files: dict[str, str]
    runs_on_images: bool
    unknown: list[str]
    checked_splits: dict[str, int]


@dataclass
class Adoption:
    """What adopting a source gives: the module, its card entries and the files to write, and in
    words where its embedding comes from (the summary prints it)."""

    module: nn.Module
    embedding_dim: int
    card: AdoptedEntries
    # File name in the model directory → writes that file at the given path.
    files: dict[str, Callable[[Path], object]] = field(default_factory=dict)
    embedding_from: str = "the network's output"


class ModelSource:
    """One form a model made elsewhere comes in: ``adopt`` reads it once; ``rebuild`` makes the
    module again from the card and the model directory, for ``checkpoint.pt`` to be loaded into."""

    Options: ClassVar[type[SourceOptions]] = SourceOptions
    # Whether the adopted model embeds images; False: it holds the vectors of known items only.
    runs_on_images: ClassVar[bool] = True
    registry_name: ClassVar[str]

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        """The adopted module of the source file ``path``; ``required``: split → the item ids
        whose vectors the model must give (embeddings-only sources check them)."""
        raise NotImplementedError

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        raise NotImplementedError


MODEL_SOURCES: Registry[ModelSource] = Registry("model source")


def build_source(kind: str, options: Mapping[str, Any]) -> ModelSource:
    source_class = MODEL_SOURCES.get(kind)
    try:
        return source_class(source_class.Options.model_validate(dict(options)))
    except ValidationError as err:
        raise not_valid(
            err,
            f"options of model source {kind!r} are not valid",
            hint=f"see {source_class.Options.__name__} in modelupgrade/models/adoption_options.py",
        ) from None


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def probe(network: nn.Module, preprocessing: PreprocessingCard, what: str) -> int:
    """The embedding dimension of ``network``, from its output on a probe batch, which must be
    (PROBE_IMAGES, D)."""
    size, channels = preprocessing.input_size, preprocessing.channels
    network.eval()
    try:
        with torch.no_grad():
            out = network(torch.zeros(PROBE_IMAGES, channels, size, size))
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - foreign networks raise anything on a wrong input
        raise UserError(
            f"{what} fails on {channels}×{size}×{size} inputs: {first_line(err)}",
            hint="set preprocessing.input_size and channels to what the network was trained on",
        ) from None
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != PROBE_IMAGES:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(
            f"{what} returns {shape} for a batch of {PROBE_IMAGES} images, not "
            f"({PROBE_IMAGES}, D) embeddings",
            hint="export the network so that its forward returns one embedding vector per image",
        )
    return int(out.shape[1])


def check_declared_dim(dim: int, declared: int | None, what: str, hint: str) -> None:
    """An error when ``what`` gives ``dim``-dimensional embeddings but ``declared`` says
    otherwise: a model adopted with another dimension than its owner expects is not theirs."""
    if declared is not None and dim != declared:
        raise UserError(
            f"{what} gives {dim}-dimensional embeddings, not the {declared} its options declare "
            "(embedding_dim)",
            hint=hint,
        )
