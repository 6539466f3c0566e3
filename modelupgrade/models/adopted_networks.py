"""The forms of a model made elsewhere that run on images, each a ``MODEL_SOURCES`` entry:

- ``timm``: a timm architecture name (and its kwargs) plus a local state-dict file;
- ``torchvision``: a torchvision architecture name plus a local state-dict file;
- ``torchscript``: a TorchScript file whose forward returns (N, D) embeddings;
- ``torch_export``: a ``torch.export`` program (.pt2) whose forward returns (N, D) embeddings.

A state-dict network's embedding is the output of its ``embedding_layer`` when one is named (the
layers after it do not run), else its features before the classifier, which is dropped. Weights
the file holds for a dropped layer are an error unless that layer was named as the classifier: a
dropped layer may have been the embedding, and adoption must not change the model silently.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from modelupgrade.cards import verified_weights
from modelupgrade.errors import UserError
from modelupgrade.models.adopted_modules import AdoptedNetwork, ExportedProgram, OutputOfLayer
from modelupgrade.models.adoption_options import (
    NetworkOptions,
    SourceOptions,
    StateDictOptions,
    TorchExportOptions,
    TorchScriptOptions,
    TorchvisionOptions,
)
from modelupgrade.models.adoption_source import (
    MODEL_SOURCES,
    Adoption,
    ModelSource,
    check_declared_dim,
    first_line,
    probe,
)
from modelupgrade.models.card import ModelCard
from modelupgrade.models.weights_file import load_matching, read_state_dict

TORCHSCRIPT_FILE = "network.torchscript"
EXPORTED_PROGRAM_FILE = "network.pt2"
_SHOWN = 6


def _layer(network: nn.Module, dotted: str, role: str, what: str) -> nn.Module:
    """The submodule ``dotted`` of ``network``: an error naming its top-level layers if none."""
    try:
        return network.get_submodule(dotted)
    except AttributeError:
        children = ", ".join(name for name, _ in network.named_children())
        raise UserError(
            f"{what} has no layer {dotted!r}",
            hint=f"set {role} to one of its layers (dotted path); its top-level layers: {children}",
        ) from None


def _drop(network: nn.Module, dotted: str, role: str, what: str) -> None:
    """Replace the layer ``dotted`` of ``network`` by the identity."""
    _layer(network, dotted, role, what)
    parent_path, _, name = dotted.rpartition(".")
    parent = network.get_submodule(parent_path) if parent_path else network
    setattr(parent, name, nn.Identity())


class _StateDictSource(ModelSource):
    """A named architecture plus a local state-dict file."""

    Options: ClassVar[type[SourceOptions]] = StateDictOptions

    @classmethod
    def network(cls, options: StateDictOptions) -> tuple[nn.Module, str]:
        """The architecture, its classifier dropped unless ``embedding_layer`` is named, and the
        name of the layer dropped ("" when none)."""
        raise NotImplementedError

    @classmethod
    def embedding_module(cls, network: nn.Module, options: StateDictOptions) -> nn.Module:
        if options.embedding_layer is None:
            return network
        _layer(network, options.embedding_layer, "embedding_layer", cls.describe(options))
        return OutputOfLayer(network, options.embedding_layer)

    @classmethod
    def describe(cls, options: StateDictOptions) -> str:
        return f"{cls.registry_name} {options.network}"

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        options = self.options
        assert isinstance(options, StateDictOptions)
        network, dropped = self.network(options)
        what = self.describe(options)
        state = read_state_dict(path, "weights file", options.key_prefix)
        report = load_matching(network, state, path, what)
        if report.ignored and options.classifier_layer is None and options.embedding_layer is None:
            shown = [f"{key} {tuple(state[key].shape)}" for key in report.ignored[:_SHOWN]]
            raise UserError(
                f"{path} holds weights that adopting {what} would drop with its classifier "
                f"{dropped!r}: {', '.join(shown)}{' …' if len(report.ignored) > _SHOWN else ''}",
                hint=f"if layer {dropped}'s output is your embedding, set embedding_layer: "
                f"{dropped}; if it is a classifier, set classifier_layer: {dropped} to drop it",
            )
        module = self.embedding_module(network, options)
        preprocessing = options.preprocessing.card()
        dim = probe(module, preprocessing, what)
        check_declared_dim(
            dim,
            options.embedding_dim,
            what + (f" at layer {options.embedding_layer!r}" if options.embedding_layer else ""),
            "name the layer whose output is the embedding (embedding_layer), or correct "
            "embedding_dim",
        )
        return Adoption(
            AdoptedNetwork(module, preprocessing, dim),
            dim,
            {
                "preprocessing": preprocessing,
                "ignored_keys": report.ignored,
                "unknown": options.preprocessing.unknown(),
            },
            embedding_from=(
                f"layer {options.embedding_layer!r}"
                if options.embedding_layer
                else f"the features before its classifier {dropped!r} (dropped)"
                if dropped
                else "the network's output"
            ),
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        assert card.adopted is not None and card.adopted.preprocessing is not None
        options = cls.Options.model_validate(card.adopted.options)
        assert isinstance(options, StateDictOptions)
        module = cls.embedding_module(cls.network(options)[0], options)
        return AdoptedNetwork(module, card.adopted.preprocessing, card.embedding_dim)


@MODEL_SOURCES.register("timm")
class TimmSource(_StateDictSource):
    """A timm architecture, never pretrained by timm (the weights are the file's): without its
    classifier (pooled features), or whole up to ``embedding_layer``."""

    @classmethod
    def network(cls, options: StateDictOptions) -> tuple[nn.Module, str]:
        import timm

        if not timm.is_model(options.network):
            raise UserError(
                f"timm has no model named {options.network!r}",
                hint="see timm.list_models(); a torchvision model is kind torchvision",
            )
        whole = options.embedding_layer is not None
        kwargs: dict[str, Any] = {
            "in_chans": options.preprocessing.channels,
            **options.network_kwargs,
            # Without an embedding layer the classifier goes, whatever num_classes the kwargs say.
            **({} if whole else {"num_classes": 0}),
        }
        try:
            network = timm.create_model(options.network, pretrained=False, **kwargs)
        except TypeError as err:
            raise UserError(
                f"timm model {options.network!r} rejected network_kwargs "
                f"{options.network_kwargs}: {err}",
                hint="remove or rename the offending key",
            ) from None
        if whole:
            return network, ""
        own = str(getattr(network, "pretrained_cfg", {}).get("classifier") or "")
        if options.classifier_layer is not None and options.classifier_layer != own:
            _drop(network, options.classifier_layer, "classifier_layer", cls.describe(options))
            return network, options.classifier_layer
        return network, own


@MODEL_SOURCES.register("torchvision")
class TorchvisionSource(_StateDictSource):
    """A torchvision architecture (``weights=None``: nothing downloaded), its classifier layer
    (default ``fc``) replaced by the identity unless ``embedding_layer`` is named."""

    Options: ClassVar[type[SourceOptions]] = TorchvisionOptions

    @classmethod
    def network(cls, options: StateDictOptions) -> tuple[nn.Module, str]:
        import torchvision

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
        if options.embedding_layer is not None:
            return network, ""
        classifier = options.classifier_layer or "fc"
        _drop(network, classifier, "classifier_layer", cls.describe(options))
        return network, classifier


class _ProgramFileSource(ModelSource):
    """A compiled network in one file (TorchScript, torch.export): copied into the model
    directory and loaded from there; its forward must map images to (N, D) embeddings."""

    file_name: ClassVar[str]
    form: ClassVar[str]

    @classmethod
    def load(cls, path: Path) -> nn.Module:
        raise NotImplementedError

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        options = self.options
        assert isinstance(options, NetworkOptions)
        network = self.load(path)
        preprocessing = options.preprocessing.card()
        dim = probe(network, preprocessing, f"{self.form} {path}")
        check_declared_dim(
            dim,
            options.embedding_dim,
            f"{self.form} {path}",
            "correct embedding_dim, or export the network that gives those embeddings",
        )
        return Adoption(
            AdoptedNetwork(network, preprocessing, dim),
            dim,
            {
                "preprocessing": preprocessing,
                "files": {"network": self.file_name},
                "unknown": [*options.preprocessing.unknown(), f"architecture ({self.form})"],
            },
            {self.file_name: lambda target: shutil.copyfile(path, target)},
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        assert card.adopted is not None and card.adopted.preprocessing is not None
        network = cls.load(verified_weights(directory, card, card.adopted.files["network"]))
        return AdoptedNetwork(network, card.adopted.preprocessing, card.embedding_dim)


@MODEL_SOURCES.register("torchscript")
class TorchScriptSource(_ProgramFileSource):
    """A TorchScript file (``torch.jit.save``)."""

    Options: ClassVar[type[SourceOptions]] = TorchScriptOptions
    file_name = TORCHSCRIPT_FILE
    form = "TorchScript"

    @classmethod
    def load(cls, path: Path) -> nn.Module:
        try:
            return torch.jit.load(str(path), map_location="cpu")
        except (RuntimeError, ValueError) as err:
            raise UserError(
                f"{path} is not a TorchScript file: {first_line(err)}",
                hint="save it with torch.jit.save(torch.jit.script(model) or "
                "torch.jit.trace(...)); a torch.export program (.pt2) is kind torch_export",
            ) from None


@MODEL_SOURCES.register("torch_export")
class TorchExportSource(_ProgramFileSource):
    """A ``torch.export`` program (``torch.export.save``). One exported for a fixed batch size
    runs on any number of images, in slices of that size."""

    Options: ClassVar[type[SourceOptions]] = TorchExportOptions
    file_name = EXPORTED_PROGRAM_FILE
    form = "torch.export program"

    @classmethod
    def load(cls, path: Path) -> nn.Module:
        try:
            program = torch.export.load(str(path))
        except Exception as err:  # noqa: BLE001 - the deserialiser raises many kinds
            raise UserError(
                f"{path} is not a torch.export program: {first_line(err)}",
                hint="save it with torch.export.save(torch.export.export(model, (images,)), path); "
                "a TorchScript file is kind torchscript",
            ) from None
        return ExportedProgram(program.module(), _fixed_batch(program))


def _fixed_batch(program: torch.export.ExportedProgram) -> int | None:
    """The batch size ``program`` was exported for, or None where its batch dimension is
    dynamic (``dynamic_shapes``)."""
    inputs = program.graph_signature.user_inputs
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in inputs:
            value = node.meta.get("val")
            size = None if value is None else value.shape[0]
            return size if isinstance(size, int) else None
    return None
