"""Adopt a model made elsewhere as a generation: ``modelupgrade adopt``.

The model is an entry of ``adopted`` in params.yaml (a timm or torchvision state dict, a
TorchScript file, or precomputed embeddings; ``modelupgrade.models.adopted``). It is written as a
model directory like a trained generation's, so ``train --old``, ``embed``, the heads and the store
take it as they take a gen0 trained here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelupgrade.commands.results import SavedWithCard
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.layout import EVALUATION_SPLITS, NEW_TRAIN_SPLIT, OLD_MODEL, StudyLayout
from modelupgrade.models.card import ModelCard

AdoptedModel = SavedWithCard[ModelCard]


def adopt(
    params: Params,
    model: str,
    scenario: str | None = None,
    out: Path | None = None,
    split: Sequence[Path] = (),
) -> AdoptedModel:
    """Adopt a model made elsewhere (an entry of 'adopted' in params.yaml) as a generation.

    Writes a model directory like a trained generation's (card.json and checkpoint.pt, every file
    hashed; the card records the source file, its sha256, the preprocessing and what is unknown).
    With --scenario it becomes the scenario's old model, models/<sc>/gen0. An embeddings-only model
    must hold a vector for every image of the splits it will be asked about: by default the
    scenario's new_train, query and gallery splits.

    Args:
        params: the params file: its 'adopted' entry describes the model
        model: an entry of 'adopted' in params.yaml
        scenario: scenario of params.yaml whose old model this becomes (default --out:
            models/<sc>/gen0)
        out: model directory to write (default with --scenario: models/<sc>/gen0)
        split: split files (or plain tables with an item_id column) an embeddings-only model must
            hold a vector for every item of (default with --scenario: its new_train, query and
            gallery splits)
    """
    from modelupgrade.cards import CARD_FILE
    from modelupgrade.data.image_table import read_image_rows
    from modelupgrade.models.adopted import MODEL_SOURCES, adopt_model
    from modelupgrade.registry import track_stage
    from modelupgrade.training.generation import split_item_ids

    if model not in params.adopted:
        raise UserError(
            f"params.yaml adopts no model named {model!r}",
            hint=f"entries under 'adopted': {', '.join(params.adopted) or 'none'}",
        )
    entry = params.adopted[model]
    layout = StudyLayout()
    if out is None:
        if scenario is None:
            raise UserError(
                "--out is required without --scenario", hint="pass --scenario NAME or --out DIR"
            )
        params.scenario(scenario)
        out = layout.model(scenario, OLD_MODEL)
    splits = list(split)
    if not splits and scenario is not None:
        splits = [
            layout.split_file(scenario, name) for name in (NEW_TRAIN_SPLIT, *EVALUATION_SPLITS)
        ]
    required = {}
    if not MODEL_SOURCES.get(entry.kind).runs_on_images:
        # Only a model that cannot run is limited to the items it holds vectors for.
        required = {
            Path(path).stem: split_item_ids(read_image_rows(path, "split"), path) for path in splits
        }
    asked = {"model": model, "kind": entry.kind, "scenario": scenario, "out": out}
    with track_stage("adopt", params, run_name=f"adopt@{out}", arguments=asked) as stage:
        if scenario is not None:
            stage.set_tags({"scenario": scenario})
        stage.log_params({"adopted": {"name": model, **entry.model_dump(mode="json")}})
        card = adopt_model(
            entry.kind,
            entry.options,
            out,
            required,
            {"architecture_name": model, "data": {"scenario": scenario}},
        )
        stage.log_metrics({"embedding_dim": card.embedding_dim, "parameters": card.parameters})
        stage.log_artifact(Path(out) / CARD_FILE, "model")
    assert card.adopted is not None
    heading = (
        f"adopted {model} ({entry.kind}) as {out}: {card.embedding_dim}-dimensional embeddings "
        f"from {card.adopted.embedding_from}"
    )
    if card.adopted.ignored_keys:
        heading += f"; {len(card.adopted.ignored_keys)} key(s) of the file not used"
    return AdoptedModel(Path(out), card, [], ("model", "written"), heading)
