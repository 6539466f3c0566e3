"""Train a transformation head on cached embeddings: the train_heads stages, the flows' task.

The head's training is the library's (``modelupgrade.heads.pipeline``); this command records it as
a stage run and, with ``--outputs-dir``, writes the head's outputs on the evaluation embeddings in
the same process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelupgrade.commands.results import SavedWithCard
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.heads.card import HeadCard

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
    from modelupgrade.heads.persistence import CARD_FILE
    from modelupgrade.heads.pipeline import head_entry, train_and_save_head
    from modelupgrade.heads.training import resolve_training
    from modelupgrade.registry import track_stage
    from modelupgrade.runtime import select_device

    evaluation = (outputs_dir, evaluation_old, evaluation_new)
    if any(p is not None for p in evaluation) and not all(p is not None for p in evaluation):
        raise UserError(
            "--outputs-dir, --evaluation-old and --evaluation-new go together",
            hint="give all three, or none",
        )
    asked = {
        "head": head,
        "old_embeddings": old_embeddings,
        "new_embeddings": new_embeddings,
        "labels": labels,
        "out": out,
        "new_model": new_model,
        "old_model": old_model,
        "side_info": side_info,
        "previous_heads": [str(p) for p in previous_heads],
    }
    with track_stage(
        "train_heads", params, run_name=f"train_heads@{out}", arguments=asked
    ) as stage:
        entry = head_entry(params, head)
        stage.log_params(
            {
                "seed": params.seed,
                "head": {"name": head, **entry.model_dump()},
                "training": resolve_training(entry).as_dict(),
            }
        )
        card = train_and_save_head(
            params,
            head,
            old_embeddings,
            new_embeddings,
            labels,
            out,
            new_model=new_model,
            old_model=old_model,
            side_info=side_info,
            previous_heads=previous_heads,
        )
        stage.log_metrics(card.headline_metrics())
        stage.log_artifact(Path(out) / CARD_FILE, "head")
    written: list[Path] = []
    if outputs_dir is not None and evaluation_old is not None and evaluation_new is not None:
        # The pipeline applies each head right after training it: one interpreter start, not two.
        written = write_head_outputs(
            out, evaluation_old, evaluation_new, outputs_dir, device=select_device(params.device)
        )
    heading = f"head {card.name} ({card.kind}) saved to {Path(out)}:"
    return TrainedHead(Path(out), card, written, ("head", "outputs"), heading)
