"""Stage: train one transformation head on cached embeddings and save it with its model card.

    python -m stages.train_heads --params params.yaml --head bict \
        --old-embeddings embeddings/extended-data/gen0/new_train.npy \
        --new-embeddings embeddings/extended-data/gen1-bct/new_train.npy \
        --labels data/splits/extended-data/new_train.parquet \
        --new-model models/extended-data/gen1-bct \
        --out heads/extended-data/bict-bct

``--head`` names an entry of ``heads`` in params.yaml. Heads that train through the new classifier
(dmu, fastfill) need ``--new-model``; for a DMU new model that already carries its jointly trained
ψ (``forward_head.pt``), the dmu head wraps it instead of training. ``--previous-heads`` (sequential
upgrades) trains on the chain's current gallery state of the old embeddings, mixed with the
generation before when ``input_momentum`` > 0.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.heads import (
    HEADS,
    DMUForwardAdapter,
    EmbeddingPairs,
    Head,
    HeadChain,
    apply,
    build_head,
    fit_head,
    head_dims,
    load_head,
    read_head_card,
    resolve_training,
    save_head,
    write_head_outputs,
)
from modelupgrade.io import file_sha256
from modelupgrade.layers import MarginClassifier
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import describe_device, seed_everything, select_device, setup_logging

log = logging.getLogger("stages.train_heads")

# The numbers of a head's training record that go to MLflow as its run's metrics.
HEAD_METRICS = ("final_loss", "steps", "seconds", "fit_cosine")


def load_embeddings(path: str | Path, what: str) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file {path} does not exist", hint="run the embed stage first")
    array = np.load(path, allow_pickle=False)
    if array.ndim != 2:
        raise UserError(f"{what} file {path} must hold a 2-D (N, D) array, got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.float32)


def load_labels(path: str | Path) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"labels file {path} does not exist", hint="run the split stage first")
    frame = pd.read_parquet(path, columns=None)
    if "label" not in frame.columns:
        raise UserError(f"{path} has no 'label' column", hint="pass a split file (rows of the manifest)")
    return frame["label"].to_numpy(dtype=np.int64)


def load_new_classifier(model_dir: str | Path) -> MarginClassifier:
    from modelupgrade.models import load_model

    return load_model(model_dir).classifier


def _source(path: str | Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    path = Path(path)
    entry: dict[str, Any] = {"path": str(path)}
    if path.is_file():
        entry["sha256"] = file_sha256(path)
    elif (path / "card.json").is_file():
        entry["card_sha256"] = file_sha256(path / "card.json")
    return entry


def fit_cosine(head: Head, inputs: np.ndarray, targets: np.ndarray, side_info: np.ndarray | None) -> float:
    """Mean cosine between the head's transform of the training inputs and the training targets."""
    out = apply(head, inputs, side_info=side_info)
    norms = np.linalg.norm(out, axis=1) * np.linalg.norm(targets, axis=1)
    return float(np.mean(np.sum(out * targets, axis=1) / np.maximum(norms, 1e-12)))


def run(
    params: Params,
    head_name: str,
    old_embeddings: str | Path,
    new_embeddings: str | Path,
    labels: str | Path,
    out: str | Path,
    new_model: str | Path | None = None,
    old_model: str | Path | None = None,
    side_info: str | Path | None = None,
    previous_heads: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Train (or wrap) the head ``head_name`` of params.yaml and save it to ``out``; returns its card."""
    asked = {"head": head_name, "old_embeddings": old_embeddings, "new_embeddings": new_embeddings, "labels": labels,
             "out": out, "new_model": new_model, "old_model": old_model, "side_info": side_info,
             "previous_heads": [str(p) for p in previous_heads]}
    with track_stage("train_heads", params, run_name=f"train_heads@{out}", arguments=asked) as stage:
        if head_name not in params.heads:
            raise UserError(
                f"params.yaml defines no head {head_name!r}",
                hint=f"heads defined: {', '.join(params.heads) or 'none'}",
            )
        head_params = params.heads[head_name]
        head_class = HEADS.get(head_params.kind)
        training = resolve_training(head_params)
        stage.log_params({"seed": params.seed, "head": {"name": head_name, **head_params.model_dump()},
                          "training": training.as_dict()})
        device = select_device(params.device)
        seed_everything(params.seed)

        old = load_embeddings(old_embeddings, "old embeddings")
        new = load_embeddings(new_embeddings, "new embeddings")
        side = load_embeddings(side_info, "side information") if side_info is not None else None
        data = EmbeddingPairs(old, new, load_labels(labels), side)

        previous_dirs = [str(p) for p in previous_heads]
        inputs = None
        if previous_dirs:
            if head_class.direction != "forward":
                raise UserError("--previous-heads chains forward adapters; a reverse head cannot follow them")
            previous = [load_head(d)[0] for d in previous_dirs]
            momenta = [float(read_head_card(d).get("input_momentum", 0.0)) for d in previous_dirs]
            inputs = HeadChain(previous, momenta).next_input(old, training.input_momentum)
        elif training.input_momentum:
            raise UserError(
                f"heads.{head_name}.input_momentum is {training.input_momentum} but no --previous-heads were given",
                hint="momentum mixes two earlier gallery generations; it applies from the second upgrade on",
            )

        in_dim, out_dim = head_dims(head_params.kind, old.shape[1], new.shape[1])
        if inputs is not None:
            in_dim = inputs.shape[1]
        sources = {
            "old_embeddings": _source(old_embeddings),
            "new_embeddings": _source(new_embeddings),
            "labels": _source(labels),
            "new_model": _source(new_model),
            "old_model": _source(old_model),
            "side_info": _source(side_info),
        }

        joint = (
            head_params.kind == "dmu"
            and head_params.options.get("use_joint_head", True)
            and new_model is not None
            and DMUForwardAdapter.has_joint_head(new_model)
        )
        if joint:
            head: Head = DMUForwardAdapter.from_joint_training(new_model)  # type: ignore[arg-type]
            if (head.in_dim, head.out_dim) != (in_dim, out_dim):
                raise UserError(
                    f"the jointly trained DMU head maps {head.in_dim}-d to {head.out_dim}-d, but the "
                    f"embeddings are {in_dim}-d old and {out_dim}-d new",
                    hint="pass the embeddings of the models this DMU head was trained with",
                )
            training_record: dict[str, Any] = {"mode": "joint", "trained_with": str(new_model)}
            log.info("head %s: wrapping the ψ trained jointly with %s", head_name, new_model)
        else:
            classifier = load_new_classifier(new_model) if head_class.needs_classifier and new_model else None
            head = build_head(
                head_params.kind, in_dim, out_dim, training.hidden_dim, training.depth,
                options=head_params.options, side_info_dim=0 if side is None else side.shape[1],
            )
            result = fit_head(head, data, training, classifier=classifier, device=device, seed=params.seed, inputs=inputs)
            head = head.cpu()
            training_record = {
                "mode": "standalone",
                **training.as_dict(),
                "epoch_losses": result.epoch_losses,
                "final_loss": result.final_loss,
                "steps": result.steps,
                "seconds": round(result.seconds, 3),
                "device": describe_device(device),
                "seed": params.seed,
            }
        source_vectors = inputs if inputs is not None else (old if head.direction == "forward" else new)
        target_vectors = new if head.direction == "forward" else old
        training_record["fit_cosine"] = fit_cosine(head, source_vectors, target_vectors, side)
        card = save_head(
            head, out,
            name=head_name,
            input_momentum=training.input_momentum,
            previous_heads=previous_dirs,
            training=training_record,
            sources=sources,
        )
        stage.log_metrics({**{k: v for k, v in training_record.items() if k in HEAD_METRICS},
                           "macs_per_embedding": card["macs_per_embedding"]})
        stage.log_artifact(Path(out) / "card.json", "head")
        log.info(
            "head %s (%s) saved to %s: fit cosine %.4f, %d MACs per embedding",
            head_name, head_params.kind, out, training_record["fit_cosine"], card["macs_per_embedding"],
        )
    return card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stages.train_heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--head", required=True, help="name of an entry under 'heads' in params.yaml")
    parser.add_argument("--old-embeddings", required=True, help="old-model embeddings of the training split (.npy)")
    parser.add_argument("--new-embeddings", required=True, help="new-model embeddings of the same split (.npy)")
    parser.add_argument("--labels", required=True, help="the split file (.parquet) the embeddings were computed on")
    parser.add_argument("--out", required=True, help="output directory (head.pt, card.json)")
    parser.add_argument("--new-model", help="new model directory (classifier for dmu/fastfill; lineage)")
    parser.add_argument("--old-model", help="old model directory (lineage only)")
    parser.add_argument("--side-info", help="side-information vectors of the training split (.npy), fct only")
    parser.add_argument(
        "--previous-heads", nargs="*", default=[],
        help="earlier generations' head directories, oldest first (sequential upgrades)",
    )
    parser.add_argument(
        "--outputs-dir",
        help="after training, write the head's outputs on the evaluation embeddings here (ψ(old gallery), "
             "σ², ψ_rev(new query), ρ); needs --evaluation-old and --evaluation-new",
    )
    parser.add_argument("--evaluation-old", help="old model's evaluation embeddings (query.npy, gallery.npy)")
    parser.add_argument("--evaluation-new", help="new model's evaluation embeddings (query.npy, gallery.npy)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    evaluation = (args.outputs_dir, args.evaluation_old, args.evaluation_new)
    if any(evaluation) and not all(evaluation):
        raise UserError("--outputs-dir, --evaluation-old and --evaluation-new go together", hint="give all three, or none")
    setup_logging()
    params = load_params(args.params)
    run(
        params, args.head, args.old_embeddings, args.new_embeddings, args.labels,
        args.out, new_model=args.new_model, old_model=args.old_model, side_info=args.side_info,
        previous_heads=args.previous_heads,
    )
    if args.outputs_dir:
        # The pipeline applies each head right after training it: one interpreter start, not two.
        written = write_head_outputs(args.out, args.evaluation_old, args.evaluation_new, args.outputs_dir,
                                     device=select_device(params.device))
        log.info("head %s outputs: %s", args.head, ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
