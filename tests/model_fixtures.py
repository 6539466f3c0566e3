"""Small models the tests build and train: a narrow ResNet-10, one call to train a generation, the
params of a toy scenario of adopted models and its BCT successor."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from modelupgrade.config import Params, parse_params
from modelupgrade.config.training import ArchitectureParams, StrategyParams, TrainingParams
from modelupgrade.models import EmbeddingModel
from modelupgrade.params import check_params
from modelupgrade.training import train_model


def resnet10t(channels: Sequence[int] = (8, 8, 8, 8), embedding_dim: int = 8) -> dict[str, Any]:
    """A ResNet-10 of the given stage widths (stem as wide as the first) with the ordinary stem, as
    the ``architectures`` entry of params; ``ArchitectureParams(**resnet10t())`` builds it."""
    return {
        "backbone": "resnet10t",
        "backbone_kwargs": {"channels": list(channels), "stem_width": channels[0]},
        "cifar_stem": False,
        "embedding_dim": embedding_dim,
    }


def tiny_model(embedding_dim: int = 8) -> EmbeddingModel:
    """An untrained 8-channel ResNet-10 for 1×16×16 images of 4 classes."""
    architecture = ArchitectureParams(**resnet10t(embedding_dim=embedding_dim))
    return EmbeddingModel(architecture, in_chans=1, num_classes=4, input_size=16)


def train_generation(
    directory: Path,
    examples: tuple[torch.Tensor, torch.Tensor],
    name: str,
    generation: int,
    strategy: str | None = None,
    options: dict[str, Any] | None = None,
    old: Path | None = None,
    *,
    architecture: ArchitectureParams,
    training: TrainingParams,
    seed: int,
    architecture_name: str = "tiny",
    **train_options: Any,
) -> Any:
    """``train_model`` for one generation on in-memory ``(images, labels)``, quietly, into
    ``directory / name``; a ``strategy`` (its kind and ``options``) and the ``old`` model's
    directory only for a generation after the first. The card records the split as "synthetic"
    unless ``data`` says otherwise."""
    images, labels = examples
    train_options.setdefault("data", {"split": "synthetic"})
    return train_model(
        architecture=architecture,
        architecture_name=architecture_name,
        training=training,
        images=images,
        labels=labels,
        out_dir=directory / name,
        generation=generation,
        seed=seed,
        strategy_name=strategy,
        strategy_params=StrategyParams(kind=strategy, options=options or {}) if strategy else None,
        old_model_dir=old,
        progress=False,
        **train_options,
    )


# Options under which a strategy's compatibility loss acts within a few epochs on tiny data.
QUICK_STRATEGY_OPTIONS: dict[str, dict[str, Any]] = {
    "unibct": {"warmup_epochs": 1, "refresh_every": 1},
    "dmu": {"head_hidden_dim": 32},
}


def compatibility_strategies(*leave_out: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, quick options) of every registered strategy with a compatibility loss (all but
    independent training), less ``leave_out``."""
    from modelupgrade.strategies import STRATEGIES

    return [
        (kind, QUICK_STRATEGY_OPTIONS.get(kind, {}))
        for kind in sorted(STRATEGIES.names())
        if kind not in ("independent", *leave_out)
    ]


def toy_scenario_params(
    architecture_name: str,
    architecture: dict[str, Any],
    adopted: dict[str, Any],
    training: dict[str, Any],
    **sections: Any,
) -> Params:
    """Checked params of one scenario, "toy" (extended data, BCT), whose old and new models are
    both of ``architecture`` (named ``architecture_name``), with the ``adopted`` models and
    ``training``, on the CPU; ``sections`` add to the others or replace them."""
    return check_params(
        parse_params(
            {
                "seed": 3,
                "device": "cpu",
                "scenarios": {
                    "toy": {
                        "kind": "extended-data",
                        "old_architecture": architecture_name,
                        "new_architecture": architecture_name,
                        "strategies": ["bct"],
                    }
                },
                "architectures": {architecture_name: architecture},
                "adopted": adopted,
                "training": training,
                "strategies": {"bct": {"kind": "bct"}},
                "sequential": {"strategies": ["bct"]},
                "registry": {"tracking_uri": "sqlite:///:memory:"},
                **sections,
            }
        )
    )


def train_toy_successor(params: Params, **options: Any) -> Any:
    """The train command's BCT generation 1 of the "toy" scenario (on ``write_toy_splits``'s
    splits in the working directory), quietly, into models/toy/gen1-bct."""
    from modelupgrade.commands.training import train

    return train(
        params,
        scenario="toy",
        generation=1,
        strategy="bct",
        out=Path("models/toy/gen1-bct"),
        progress=False,
        **options,
    )
