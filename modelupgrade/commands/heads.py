"""Train a transformation head on cached embeddings: the train_heads stages, the flows' task; and
fit the training-free adapters of the adapter study: the fit_adapters stages.

The head's training is the library's (``modelupgrade.heads.pipeline``); this command records it as
a stage run and, with ``--outputs-dir``, writes the head's outputs on the evaluation embeddings in
the same process. The adapter study (``modelupgrade.heads.adapter_study``) fits every adapter at
every sample size in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.commands.results import SavedWithCard
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.heads.card import HeadCard
from modelupgrade.json_data import JsonObject, number_at

# A saved head: its directory, its card, and the outputs written on the evaluation splits.
TrainedHead = SavedWithCard[HeadCard]


def train_heads(
    params: Params,
    head: str,
    old_embeddings: Path,
    new_embeddings: Path,
    labels: Path,
    out: Path,
    new_model: Path | None = None,
    old_model: Path | None = None,
    side_info: Path | None = None,
    previous_heads: Sequence[Path] = (),
    outputs_dir: Path | None = None,
    evaluation_old: Path | None = None,
    evaluation_new: Path | None = None,
) -> TrainedHead:
    """Train one transformation head on cached embeddings and save it with its card.

    Heads that train through the new classifier (dmu, fastfill) need --new-model; a head kind
    trained together with the new model (DMU's jointly trained ψ in forward_head.pt) is taken from
    it instead of trained. --previous-heads (sequential upgrades) trains on the chain's current
    gallery state of the old embeddings, mixed with the generation before when input_momentum > 0.

    Args:
        params: the params file: seed, device and the heads section
        head: name of an entry under 'heads' in params.yaml
        old_embeddings: old-model embeddings of the training split (.npy)
        new_embeddings: new-model embeddings of the same split (.npy)
        labels: the split file (.parquet) the embeddings were computed on
        out: output directory (head.pt, card.json)
        new_model: new model directory (classifier for dmu/fastfill; lineage)
        old_model: old model directory (lineage only)
        side_info: side-information vectors of the training split (.npy), fct only
        previous_heads: earlier generations' head directories, oldest first (sequential upgrades)
        outputs_dir: after training, write the head's outputs on the evaluation embeddings here
            (ψ(old gallery), σ², ψ_rev(new query), ρ); needs --evaluation-old and
            --evaluation-new
        evaluation_old: old model's evaluation embeddings (query.npy, gallery.npy)
        evaluation_new: new model's evaluation embeddings (query.npy, gallery.npy)
    """
    from modelupgrade.heads import write_head_outputs
    from modelupgrade.runtime import select_device

    evaluation = (outputs_dir, evaluation_old, evaluation_new)
    if any(p is not None for p in evaluation) and not all(p is not None for p in evaluation):
        raise UserError(
            "--outputs-dir, --evaluation-old and --evaluation-new go together",
            hint="give all three, or none",
        )
    inputs = HeadInputs(
        head,
        old_embeddings,
        new_embeddings,
        labels,
        out,
        new_model,
        old_model,
        side_info,
        tuple(previous_heads),
    )
    card = _train_head_tracked(params, inputs)
    written: list[Path] = []
    if outputs_dir is not None and evaluation_old is not None and evaluation_new is not None:
        # The pipeline applies each head right after training it: one interpreter start, not two.
        written = write_head_outputs(
            out, evaluation_old, evaluation_new, outputs_dir, device=select_device(params.device)
        )
    heading = f"head {card.name} ({card.kind}) saved to {Path(out)}:"
    return TrainedHead(Path(out), card, written, ("head", "outputs"), heading)


@dataclass(frozen=True)
class HeadInputs:
    """What one head trains on and where it goes (``train_heads``' arguments of that name)."""

    head: str
    old_embeddings: Path
    new_embeddings: Path
    labels: Path
    out: Path
    new_model: Path | None
    old_model: Path | None
    side_info: Path | None
    previous_heads: tuple[Path, ...]

    def recorded(self) -> dict[str, object]:
        """The arguments as the stage's MLflow run records them."""
        return {
            "head": self.head,
            "old_embeddings": self.old_embeddings,
            "new_embeddings": self.new_embeddings,
            "labels": self.labels,
            "out": self.out,
            "new_model": self.new_model,
            "old_model": self.old_model,
            "side_info": self.side_info,
            "previous_heads": [str(p) for p in self.previous_heads],
        }


def _train_head_tracked(params: Params, inputs: HeadInputs) -> HeadCard:
    """Train and save the head inside the stage's MLflow run: its entry, training settings,
    headline metrics and card recorded."""
    from modelupgrade.heads.persistence import CARD_FILE
    from modelupgrade.heads.pipeline import head_entry, train_and_save_head
    from modelupgrade.heads.training import resolve_training
    from modelupgrade.registry import track_stage

    out = inputs.out
    with track_stage(
        "train_heads", params, run_name=f"train_heads@{out}", arguments=inputs.recorded()
    ) as stage:
        entry = head_entry(params, inputs.head)
        stage.log_params(
            {
                "seed": params.seed,
                "head": {"name": inputs.head, **entry.model_dump()},
                "training": resolve_training(entry).as_dict(),
            }
        )
        card = train_and_save_head(
            params,
            inputs.head,
            inputs.old_embeddings,
            inputs.new_embeddings,
            inputs.labels,
            out,
            new_model=inputs.new_model,
            old_model=inputs.old_model,
            side_info=inputs.side_info,
            previous_heads=inputs.previous_heads,
        )
        stage.log_metrics(card.headline_metrics())
        stage.log_artifact(Path(out) / CARD_FILE, "head")
    return card


@dataclass
class FittedAdapters:
    """The adapters one adapter-study stage fitted: each head's directory and card."""

    scenario: str
    adapters: list[tuple[Path, HeadCard]]

    def as_dict(self) -> JsonObject:
        return {
            "scenario": self.scenario,
            "adapters": [
                {"head": str(path), "card": card.as_dict()} for path, card in self.adapters
            ],
        }

    def describe(self) -> str:
        lines = [f"{self.scenario}: {len(self.adapters)} training-free adapters fitted"]
        for path, card in self.adapters:
            training = card.training
            lines.append(
                f"  {card.name:<28} {card.direction:<7} {training['sample_size']:>6} pairs  "
                f"fit cosine {training['fit_cosine']:.4f}  {training['seconds']:.3f} s  "
                f"{card.macs_per_embedding} MACs  → {path}"
            )
        return "\n".join(lines)


def fit_adapters(
    params: Params,
    scenario: str,
    root: Path = Path("."),
) -> FittedAdapters:
    """Fit the training-free adapters (Procrustes, low-rank affine, residual MLP, SLERP) at every
    sample size, and write their outputs on the evaluation embeddings.

    Every entry of adapters.heads is fitted on nested samples of adapters.sample_sizes pairs of
    the scenario's new_train embeddings under gen0 and gen1-<strategy> (the strategy that
    adapters.scenarios pairs the scenario with), in this one process. Each fit is saved to
    <heads>/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/ with its card, its outputs to
    <embeddings>/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/: ψ(old gallery) for a
    gallery-side adapter, the mapped new queries for a query-side one (SLERP also reads the old
    model's query embeddings).

    Args:
        params: the params file: seed, device and the adapters section
        scenario: a scenario listed under adapters.scenarios
        root: the study directory: data/splits, models, embeddings, heads, metrics and plots
            below it (default: the current directory)
    """
    import torch

    from modelupgrade.heads.adapter_study import adapter_strategy, fit_adapter_study
    from modelupgrade.layout import StudyLayout
    from modelupgrade.registry import track_stage
    from modelupgrade.runtime import select_device

    if params.training.cpu_threads is not None:
        # As the training stages: the adapters' small matrices spin-wait on shared cores with
        # more threads (the residual MLP's epochs took 10× longer with two on two busy cores).
        torch.set_num_threads(params.training.cpu_threads)
    layout = StudyLayout(root)
    asked = {"scenario": scenario, "root": layout.root}
    with track_stage(
        "fit_adapters", params, run_name=f"fit_adapters@{scenario}", arguments=asked
    ) as stage:
        strategy = adapter_strategy(params, scenario)
        stage.set_tags({"scenario": scenario, "strategy": strategy})
        stage.log_params({"seed": params.seed, "adapters": params.adapters})
        fitted = fit_adapter_study(params, scenario, layout, select_device(params.device))
        stage.log_metrics(
            {
                f"{a.card.name}.{key}": float(number_at(a.card.training, key))
                for a in fitted
                for key in ("fit_cosine", "seconds")
            }
        )
    return FittedAdapters(scenario, [(a.head_dir, a.card) for a in fitted])
