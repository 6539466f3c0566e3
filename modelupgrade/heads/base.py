"""The interface every transformation head implements, and the registry that names them.

A head is a small network trained on frozen, cached embeddings of the same training images under
the old and the new model. Two directions exist:

* ``forward`` (old → new): applied once to the *stored* gallery vectors (FCT, BiCT, DMU, FastFill);
* ``reverse`` (new → old): applied to the *query* so it can search the old, not yet backfilled,
  part of the gallery (RQT, MCL, RM full method).

Every head owns a module ``psi`` (its main transform: an MLP unless the kind builds another in
``build_transform``) and may own more modules (FastFill's uncertainty layer, the RM full
method's ρ). ``outputs`` returns every named output in one pass; ``transform`` is always present
and is what a deployment applies.

Training-free adapters (Drift-Adapter's Procrustes, low-rank affine and residual MLP; SLERP) fit
through the same interface: ``fit_closed_form`` sets their parameters from the paired training
vectors, and a kind that is not ``iterative`` runs no gradient steps after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast, get_args

import numpy as np
import torch
from torch import nn

from modelupgrade.config.base import Section
from modelupgrade.config.heads import HeadTraining
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.layers import MLP, MarginClassifier, Transform
from modelupgrade.plugins import Registry

Direction = Literal["forward", "reverse"]

HEADS: Registry[Head] = Registry("head")
# What a kind may declare in its class statement besides kind and direction (see ``Head``).
TRAITS = (
    "needs_classifier",
    "accepts_side_info",
    "class_balanced_batches",
    "output_names",
    "training_free",
    "iterative",
    "takes_old_embedding",
    "aligns",
)
OptionsT = TypeVar("OptionsT", bound=Section)


class NoOptions(Section):
    """A head kind without hyper-parameters of its own."""


@dataclass(frozen=True)
class EmbeddingPairs:
    """Cached embeddings of the same training images (row i = image i in both arrays)."""

    old: np.ndarray
    new: np.ndarray
    labels: np.ndarray
    side_info: np.ndarray | None = None

    def __post_init__(self) -> None:
        rows = {"old": self.old, "new": self.new, "labels": self.labels}
        if self.side_info is not None:
            rows["side_info"] = self.side_info
        counts = {name: len(array) for name, array in rows.items()}
        if len(set(counts.values())) != 1:
            raise UserError(
                f"the training arrays disagree on the number of images: {counts}",
                hint="old and new embeddings, labels and side information must all come from the "
                "same split file, in its row order",
            )
        for name in ("old", "new", "side_info"):
            array = rows.get(name)
            if array is None:
                continue
            if array.ndim != 2:
                raise UserError(
                    f"{name} embeddings must be a 2-D array (N, D), got shape {array.shape}"
                )
            if not np.isfinite(array).all():
                raise UserError(f"{name} embeddings contain NaN or infinite values")
        if self.labels.ndim != 1 or not np.issubdtype(self.labels.dtype, np.integer):
            raise UserError(
                f"labels must be a 1-D integer array, got dtype {self.labels.dtype}, "
                f"shape {self.labels.shape}"
            )
        if counts["old"] < 2:
            raise UserError("at least two training images are needed to train a head")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class HeadBatch:
    """One training batch on the training device; ``classifier`` is the frozen new classifier."""

    old: torch.Tensor
    new: torch.Tensor
    labels: torch.Tensor
    side_info: torch.Tensor | None = None
    classifier: MarginClassifier | None = None


class Head(nn.Module, Generic[OptionsT]):
    """Base of every head. A kind is declared by its class statement alone: its options as the
    type argument, its name, direction and traits (the class variables below) as class keywords,

        class FCTAdapter(Head[FCTOptions], kind="fct", direction="forward", accepts_side_info=True):

    which registers it in ``HEADS``; the class then implements ``loss`` (or, training-free,
    ``fit_closed_form``)."""

    registry_name: ClassVar[str]
    direction: ClassVar[Direction]
    # The settings of the paper that defines the kind; params.yaml overrides any of them.
    TRAINING_DEFAULTS: ClassVar[HeadTraining]
    Options: ClassVar[type[Section]] = NoOptions
    options: OptionsT
    psi: Transform  # the head's main transform (``build_transform``)
    needs_classifier: ClassVar[bool] = False
    accepts_side_info: ClassVar[bool] = False
    class_balanced_batches: ClassVar[bool] = False
    output_names: ClassVar[tuple[str, ...]] = ("transform",)
    # A training-free adapter (Drift-Adapter, SLERP): fitted post hoc on paired embeddings alone
    # (no labels, no classifier); the evaluation reports it apart from the trained heads.
    training_free: ClassVar[bool] = False
    # False: ``fit_closed_form`` is the whole fit (``fit_head`` runs no epochs).
    iterative: ClassVar[bool] = True
    # The transform also reads the old model's embedding of the same input (SLERP's old query),
    # given as its side input: its side_info_dim is the old dimension (``out_dim`` of a reverse
    # head), and training feeds it the old embeddings of the training images.
    takes_old_embedding: ClassVar[bool] = False
    # Whether the kind's loss pulls each output onto the embedding it maps to (a regression: FCT,
    # FastFill, BiCT, RQT), so that its convergence shows as their mean cosine; False for a kind
    # trained through a classifier (DMU) or a metric over the batch (MCL), whose outputs need not
    # meet their targets one by one.
    aligns: ClassVar[bool] = True

    def __init_subclass__(
        cls, kind: str | None = None, direction: Direction | None = None, **traits: Any
    ) -> None:
        super().__init_subclass__()
        options = _options_argument(cls)
        if options is not None:
            cls.Options = options
        if direction is not None:
            cls.direction = direction
        for trait, value in traits.items():
            if trait not in TRAITS:
                raise TypeError(f"{cls.__name__}: {trait!r} is not a head trait ({TRAITS})")
            setattr(cls, trait, value)
        if kind is not None:
            HEADS.register(kind)(cls)

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_dim: int | None = None,
        depth: int | None = None,
        options: dict[str, Any] | None = None,
        side_info_dim: int = 0,
    ) -> None:
        super().__init__()
        if self.takes_old_embedding:
            side_info_dim = out_dim
        elif side_info_dim and not self.accepts_side_info:
            raise UserError(
                f"head kind {self.registry_name!r} takes no side information",
                hint="drop the side-information input or use the 'fct' head",
            )
        if in_dim < 1 or out_dim < 1:
            raise UserError(f"head dimensions must be positive, got in={in_dim}, out={out_dim}")
        # Options is the class OptionsT names (__init_subclass__ took it from the type argument).
        self.options = cast(OptionsT, self.Options.model_validate(options or {}))
        self.in_dim, self.out_dim, self.side_info_dim = (
            int(in_dim),
            int(out_dim),
            int(side_info_dim),
        )
        self.hidden_dim = int(hidden_dim or self.TRAINING_DEFAULTS.hidden_dim)
        self.depth = int(depth or self.TRAINING_DEFAULTS.depth)
        self.psi = self.build_transform()

    def build_transform(self) -> Transform:
        """The module ``psi``: an MLP of ``hidden_dim`` × ``depth`` over the input (and the side
        information); a kind with another structure overrides this. It must have
        ``macs_per_row()``."""
        return MLP(self.in_dim + self.side_info_dim, self.out_dim, self.hidden_dim, self.depth)

    @classmethod
    def trained_with(
        cls, new_model_dir: str | Path, options: Mapping[str, Any] | None = None
    ) -> Head | None:
        """This kind's head that was trained together with the new model in ``new_model_dir``,
        to be used as it is instead of training one; None when there is none (the usual case)."""
        return None

    # ----- what a deployment runs -------------------------------------------------------------
    def outputs(
        self, x: torch.Tensor, side_info: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        return {"transform": self.psi(self._with_side_info(x, side_info))}

    def forward(self, x: torch.Tensor, side_info: torch.Tensor | None = None) -> torch.Tensor:
        return self.outputs(x, side_info)["transform"]

    def macs_per_embedding(self) -> dict[str, int]:
        """Multiply-accumulates per input vector, by output (BN folds into the linear layers)."""
        return {"transform": self.psi.macs_per_row()}

    # ----- training ----------------------------------------------------------------------------

    def calibrate(self, batch: HeadBatch) -> None:
        """After a closed-form fit, choose what the kind chooses on held-out pairs (nothing by
        default; SLERP its α on a support split)."""

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        raise NotImplementedError

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Set parameters from the paired training vectors (row i of ``source`` and ``target`` is
        the same image; ``source`` is what the head transforms), before the gradient steps or,
        for a kind that is not ``iterative``, instead of them. Called under ``torch.no_grad``.
        Default: nothing (the head trains by gradient steps alone)."""

    def source(self, batch: HeadBatch) -> torch.Tensor:
        """The embedding this head transforms (old for forward heads, new for reverse heads)."""
        return batch.old if self.direction == "forward" else batch.new

    def target(self, batch: HeadBatch) -> torch.Tensor:
        return batch.new if self.direction == "forward" else batch.old

    def architecture(self) -> JsonObject:
        """What ``build_head`` needs to rebuild this head (goes into the model card)."""
        return {
            "kind": self.registry_name,
            "direction": self.direction,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "side_info_dim": self.side_info_dim,
            "hidden_dim": self.hidden_dim,
            "depth": self.depth,
            "options": self.options.model_dump(mode="json"),
            "outputs": list(self.output_names),
        }

    # ----- input checks ------------------------------------------------------------------------
    def check_input(self, width: int, side_info_width: int | None) -> None:
        if width != self.in_dim:
            raise UserError(
                f"head {self.registry_name!r} expects {self.in_dim}-d input vectors, got {width}-d",
                hint=f"a {self.direction} head transforms "
                + (
                    "old-model (gallery) embeddings"
                    if self.direction == "forward"
                    else "new-model (query) embeddings"
                )
                + "; check that the embeddings come from the model the head was trained on",
            )
        expected = self.side_info_dim or None
        if side_info_width != expected:
            raise UserError(
                f"head {self.registry_name!r} was trained with side information of width "
                f"{self.side_info_dim}, got {side_info_width or 0}",
                hint="pass the same side-information vectors (or none) as in training",
            )

    def _with_side_info(self, x: torch.Tensor, side_info: torch.Tensor | None) -> torch.Tensor:
        if self.side_info_dim:
            if side_info is None:
                raise UserError(f"head {self.registry_name!r} needs its side-information input")
            return torch.cat([x, side_info.to(x.dtype)], dim=1)
        return x


def _options_argument(cls: type) -> type[Section] | None:
    """The options class a head class names as its own type argument (``Head[FCTOptions]``);
    None where it names none (it inherits its parent's)."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        for argument in get_args(base):
            if isinstance(argument, type) and issubclass(argument, Section):
                return argument
    return None


def build_head(kind: str, *args: Any, **kwargs: Any) -> Head:
    """A new head of the registered ``kind``; the other arguments are ``Head``'s: in_dim, out_dim,
    hidden_dim, depth, options, side_info_dim."""
    return HEADS.get(kind)(*args, **kwargs)


def head_dims(kind: str, old_dim: int, new_dim: int) -> tuple[int, int]:
    """(in_dim, out_dim) of a head of ``kind`` between an old and a new embedding space."""
    head_class = HEADS.get(kind)
    return (old_dim, new_dim) if head_class.direction == "forward" else (new_dim, old_dim)
