"""Models made elsewhere, adopted as generations: one source class per form, in ``MODEL_SOURCES``.

``modelupgrade adopt`` turns a model trained outside this tool into a model directory with the same
layout as a trained generation (``card.json`` + ``checkpoint.pt``, every file hashed), so that
training a successor, embedding, heads, the registry and the store take it like any other:

- ``timm``: a timm architecture name (and its kwargs) plus a local state-dict file;
- ``torchvision``: a torchvision architecture name plus a local state-dict file;
- ``torchscript``: a TorchScript file whose forward returns (N, D) embeddings;
- ``embeddings``: precomputed vectors of known items, for an old model that can no longer run.

A network's output is its embedding (a classification network's penultimate features: the head
is dropped, its keys ignored and listed). Images are brought to the source's channels and input
size and normalised with its mean and std; what the card cannot know (training data, a mean and
std left out, the classifier) is listed under ``adopted.unknown``. No adopted model carries a
classifier: a strategy that needs one synthesises it from class means of the old embeddings.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from modelupgrade.cards import CARD_FILE, load_weights, verified_weights
from modelupgrade.errors import UserError, not_valid
from modelupgrade.io import atomic_path, file_sha256, write_json
from modelupgrade.models.adopted_modules import (
    AdoptedNetwork,
    PrecomputedEmbeddings,
    runs_on_images,
)
from modelupgrade.models.adoption_options import (
    EmbeddingsOptions,
    Preprocessing,
    SourceOptions,
    StateDictOptions,
    TorchScriptOptions,
    TorchvisionOptions,
)
from modelupgrade.models.card import MODEL_WEIGHTS_FILE, ModelCard, PreprocessingCard
from modelupgrade.models.weights_file import checked_file, load_matching, read_state_dict
from modelupgrade.plugins import Registry

log = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "network.torchscript"
ITEM_IDS_FILE = "item_ids.parquet"
# How many images a network's output shape is probed with (more than one: a squeeze would hide).
PROBE_IMAGES = 2


# ---------------------------------------------------------------- the sources


@dataclass
class Adoption:
    """What adopting a source gives: the module, its card entries and the files to write."""

    module: nn.Module
    embedding_dim: int
    card: dict[str, Any]
    # File name in the model directory → writes that file at the given path.
    files: dict[str, Callable[[Path], object]] = field(default_factory=dict)


MODEL_SOURCES: Registry[ModelSource] = Registry("model source")


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


def build_source(kind: str, options: Mapping[str, Any]) -> ModelSource:
    source_class = MODEL_SOURCES.get(kind)
    try:
        return source_class(source_class.Options.model_validate(dict(options)))
    except ValidationError as err:
        raise not_valid(
            err,
            f"options of model source {kind!r} are not valid",
            hint=f"see {source_class.Options.__name__} in modelupgrade/models/adopted.py",
        ) from None


def _probe(network: nn.Module, preprocessing: PreprocessingCard, what: str) -> int:
    """The embedding dimension of ``network``, from its output on a probe batch, which must be
    (PROBE_IMAGES, D)."""
    size, channels = preprocessing.input_size, preprocessing.channels
    network.eval()
    try:
        with torch.no_grad():
            out = network(torch.zeros(PROBE_IMAGES, channels, size, size))
    except Exception as err:  # noqa: BLE001 - foreign networks raise anything on a wrong input
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{what} fails on {channels}×{size}×{size} inputs: {first_line}",
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


class _StateDictSource(ModelSource):
    """A named architecture plus a local state-dict file."""

    Options: ClassVar[type[SourceOptions]] = StateDictOptions

    @classmethod
    def network(cls, options: StateDictOptions) -> nn.Module:
        raise NotImplementedError

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        options = self.options
        assert isinstance(options, StateDictOptions)
        network = self.network(options)
        state = read_state_dict(path, "weights file", options.key_prefix)
        report = load_matching(network, state, path, f"{self.registry_name} {options.network}")
        preprocessing = options.preprocessing.card()
        dim = _probe(network, preprocessing, f"{self.registry_name} {options.network}")
        return Adoption(
            AdoptedNetwork(network, preprocessing, dim),
            dim,
            {
                "preprocessing": preprocessing,
                "ignored_keys": report.ignored,
                "unknown": options.preprocessing.unknown(),
            },
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        assert card.adopted is not None and card.adopted.preprocessing is not None
        options = cls.Options.model_validate(card.adopted.options)
        assert isinstance(options, StateDictOptions)
        return AdoptedNetwork(cls.network(options), card.adopted.preprocessing, card.embedding_dim)


@MODEL_SOURCES.register("timm")
class TimmSource(_StateDictSource):
    """A timm architecture, built without its classifier (pooled features) and never pretrained
    by timm: the weights are the file's."""

    @classmethod
    def network(cls, options: StateDictOptions) -> nn.Module:
        import timm

        if not timm.is_model(options.network):
            raise UserError(
                f"timm has no model named {options.network!r}",
                hint="see timm.list_models(); a torchvision model is kind torchvision",
            )
        try:
            return timm.create_model(
                options.network,
                pretrained=False,
                num_classes=0,
                in_chans=options.preprocessing.channels,
                **options.network_kwargs,
            )
        except TypeError as err:
            raise UserError(
                f"timm model {options.network!r} rejected network_kwargs "
                f"{options.network_kwargs}: {err}",
                hint="remove or rename the offending key",
            ) from None


@MODEL_SOURCES.register("torchvision")
class TorchvisionSource(_StateDictSource):
    """A torchvision architecture (``weights=None``: nothing downloaded), its classifier layer
    replaced by the identity."""

    Options: ClassVar[type[SourceOptions]] = TorchvisionOptions

    @classmethod
    def network(cls, options: StateDictOptions) -> nn.Module:
        import torchvision

        assert isinstance(options, TorchvisionOptions)
        if options.network not in torchvision.models.list_models():
            raise UserError(
                f"torchvision has no model named {options.network!r}",
                hint="see torchvision.models.list_models(); a timm model is kind timm",
            )
        try:
            network = torchvision.models.get_model(
                options.network, weights=None, **options.network_kwargs
            )
        except (TypeError, ValueError) as err:
            raise UserError(
                f"torchvision model {options.network!r} rejected network_kwargs "
                f"{options.network_kwargs}: {err}",
                hint="remove or rename the offending key",
            ) from None
        parent_path, _, name = options.classifier_layer.rpartition(".")
        parent = network.get_submodule(parent_path) if parent_path else network
        if not isinstance(getattr(parent, name, None), nn.Module):
            children = ", ".join(n for n, _ in network.named_children())
            raise UserError(
                f"torchvision {options.network} has no layer {options.classifier_layer!r}",
                hint=f"set classifier_layer to its classifier; its top-level layers: {children}",
            )
        setattr(parent, name, nn.Identity())
        return network


@MODEL_SOURCES.register("torchscript")
class TorchScriptSource(ModelSource):
    """A TorchScript file (``torch.jit.save``) whose forward maps images to (N, D) embeddings; it
    is copied into the model directory and loaded from there."""

    Options: ClassVar[type[SourceOptions]] = TorchScriptOptions

    @staticmethod
    def load(path: Path) -> nn.Module:
        try:
            return torch.jit.load(str(path), map_location="cpu")
        except (RuntimeError, ValueError) as err:
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else "unreadable"
            raise UserError(
                f"{path} is not a TorchScript file: {first_line}",
                hint="save it with torch.jit.save(torch.jit.script(model) or torch.jit.trace(...))",
            ) from None

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        options = self.options
        assert isinstance(options, TorchScriptOptions)
        network = self.load(path)
        preprocessing = options.preprocessing.card()
        dim = _probe(network, preprocessing, f"TorchScript {path}")
        if options.embedding_dim is not None and dim != options.embedding_dim:
            raise UserError(
                f"TorchScript {path} returns {dim}-dimensional embeddings, not the "
                f"{options.embedding_dim} its options expect",
                hint="correct embedding_dim, or export the network that gives those embeddings",
            )
        return Adoption(
            AdoptedNetwork(network, preprocessing, dim),
            dim,
            {
                "preprocessing": preprocessing,
                "files": {"network": TORCHSCRIPT_FILE},
                "unknown": [*options.preprocessing.unknown(), "architecture (TorchScript)"],
            },
            {TORCHSCRIPT_FILE: lambda target: shutil.copyfile(path, target)},
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        assert card.adopted is not None and card.adopted.preprocessing is not None
        network = cls.load(verified_weights(directory, card, card.adopted.files["network"]))
        return AdoptedNetwork(network, card.adopted.preprocessing, card.embedding_dim)


@MODEL_SOURCES.register("embeddings")
class EmbeddingsSource(ModelSource):
    """Precomputed vectors: a parquet table with an id and a vector column, or a .npy matrix with
    an ``ids`` file (.parquet with the id column, or text with one id a line) in row order."""

    Options: ClassVar[type[SourceOptions]] = EmbeddingsOptions
    runs_on_images: ClassVar[bool] = False

    def table(self, path: Path) -> tuple[list[str], np.ndarray]:
        import pandas as pd

        options = self.options
        assert isinstance(options, EmbeddingsOptions)
        if path.suffix == ".npy":
            if options.ids is None:
                raise UserError(
                    f"{path} is a bare matrix: say which item each row is",
                    hint="give options.ids: a parquet or text file of the item ids in row order",
                )
            ids_path, _ = checked_file(options.ids, options.ids_sha256, "ids file")
            if ids_path.suffix == ".parquet":
                ids = self._column(pd.read_parquet(ids_path), options.id_column, ids_path)
            else:
                ids = ids_path.read_text(encoding="utf-8").split()
            try:
                vectors = np.load(path, allow_pickle=False)
            except ValueError as err:
                raise UserError(f"{path} is not a numeric .npy matrix: {err}") from None
        elif path.suffix == ".parquet":
            frame = pd.read_parquet(path)
            ids = self._column(frame, options.id_column, path)
            column = self._column(frame, options.vector_column, path)
            try:
                vectors = np.stack([np.asarray(v, dtype=np.float32) for v in column])
            except ValueError as err:
                raise UserError(
                    f"column {options.vector_column!r} of {path} is not one vector per row of "
                    f"equal length: {err}"
                ) from None
        else:
            raise UserError(
                f"{path} is neither a .parquet table nor a .npy matrix",
                hint="give a parquet table (id and vector columns) or a .npy matrix with ids",
            )
        if vectors.ndim != 2 or len(vectors) != len(ids) or vectors.shape[1] < 2:
            raise UserError(
                f"{path} holds {vectors.shape} vectors for {len(ids)} ids; expected (ids, D ≥ 2)"
            )
        if len(set(ids)) != len(ids):
            raise UserError(f"the ids of {path} repeat", hint="give each item one vector")
        if not np.isfinite(vectors).all():
            bad = int((~np.isfinite(vectors).all(axis=1)).sum())
            raise UserError(f"{path} has {bad} vector(s) with NaN or infinite values")
        return [str(i) for i in ids], vectors.astype(np.float32, copy=False)

    @staticmethod
    def _column(frame: Any, name: str, path: Path) -> list[Any]:
        if name not in frame.columns:
            raise UserError(
                f"{path} has no column {name!r} (it has: {', '.join(map(str, frame.columns))})",
                hint="name the column in options (id_column, vector_column)",
            )
        return frame[name].tolist()

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        import pandas as pd

        ids, vectors = self.table(path)
        module = PrecomputedEmbeddings(
            F.normalize(torch.from_numpy(vectors), dim=1), ids, str(path)
        )
        for split, split_ids in required.items():
            module.rows(split_ids, split)
        unknown = ["architecture, weights and preprocessing (embeddings only: it cannot run)"]
        return Adoption(
            module,
            vectors.shape[1],
            {
                "files": {"item_ids": ITEM_IDS_FILE},
                "runs_on_images": self.runs_on_images,
                "unknown": unknown,
                "checked_splits": {split: len(split_ids) for split, split_ids in required.items()},
            },
            {ITEM_IDS_FILE: lambda target: pd.DataFrame({"item_id": ids}).to_parquet(target)},
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        import pandas as pd

        assert card.adopted is not None
        ids_path = verified_weights(directory, card, card.adopted.files["item_ids"])
        ids = pd.read_parquet(ids_path)["item_id"].tolist()
        return PrecomputedEmbeddings(torch.zeros(len(ids), card.embedding_dim), ids, str(directory))


# ---------------------------------------------------------------- save and load


def adopt_model(
    kind: str,
    options: Mapping[str, Any],
    out_dir: str | Path,
    required: Mapping[str, Sequence[str]] | None = None,
    card_fields: Mapping[str, Any] | None = None,
) -> ModelCard:
    """Adopt the source ``kind`` with ``options`` into the model directory ``out_dir``, written
    whole or not at all; returns its card."""
    source = build_source(kind, options)
    path, digest = checked_file(source.options.path, source.options.sha256, f"{kind} source")
    adoption = source.adopt(path, required or {})
    adopted = dict(adoption.card)
    checked = adopted.pop("checked_splits", None)
    module = adoption.module.eval()
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        state = {name: t.detach().cpu().clone() for name, t in module.state_dict().items()}
        torch.save(state, tmp / MODEL_WEIGHTS_FILE)
        for name, write in adoption.files.items():
            write(tmp / name)
        hashes = {name: file_sha256(tmp / name) for name in [MODEL_WEIGHTS_FILE, *adoption.files]}
        preprocessing = adopted.get("preprocessing")
        card = ModelCard.model_validate(
            {
                "format": ModelCard.FORMAT,
                "weights_sha256": hashes,
                "architecture": None,
                "in_chans": None if preprocessing is None else preprocessing.channels,
                "input_size": None if preprocessing is None else preprocessing.input_size,
                "embedding_dim": adoption.embedding_dim,
                "num_classes": 0,
                "classifier": None,
                "parameters": sum(p.numel() for p in module.parameters()),
                "generation": 0,
                **(card_fields or {}),
                "data": {
                    **dict((card_fields or {}).get("data", {})),
                    **({"vectors_checked_for": checked} if checked else {}),
                },
                "adopted": {
                    "kind": kind,
                    "source": str(path),
                    "source_sha256": digest,
                    "options": source.options.model_dump(mode="json"),
                    **adopted,
                    "unknown": [
                        "training data and training run",
                        "classifier (strategies that need one synthesise class means)",
                        *adopted.get("unknown", []),
                    ],
                },
            }
        )
        write_json(tmp / CARD_FILE, card.as_dict())
    log.info(
        "adopted %s %s as %s (%d-dimensional embeddings)",
        kind,
        path,
        out_dir,
        adoption.embedding_dim,
    )
    return card


def load_adopted(directory: str | Path, card: ModelCard) -> nn.Module:
    """The adopted model saved in ``directory`` (its card read), its checked weights loaded."""
    assert card.adopted is not None
    module = MODEL_SOURCES.get(card.adopted.kind).rebuild(card, Path(directory))
    try:
        module.load_state_dict(load_weights(directory, card))
    except RuntimeError as err:
        raise UserError(
            f"{Path(directory) / MODEL_WEIGHTS_FILE} does not match its card: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return module


__all__ = [
    "MODEL_SOURCES",
    "AdoptedNetwork",
    "Adoption",
    "EmbeddingsSource",
    "ModelSource",
    "PrecomputedEmbeddings",
    "Preprocessing",
    "TimmSource",
    "TorchScriptSource",
    "TorchvisionSource",
    "adopt_model",
    "build_source",
    "load_adopted",
    "runs_on_images",
]
