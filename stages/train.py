"""Stage: train one embedding model (generation 0, or a new generation under a strategy).

    python -m stages.train --params params.yaml --scenario extended-data --generation 0 \
        --out models/extended-data/gen0
    python -m stages.train --params params.yaml --scenario extended-data --generation 1 \
        --strategy bct --old models/extended-data/gen0 --out models/extended-data/gen1-bct
    python -m stages.train --params params.yaml --generation 2 --strategy bct \
        --split data/splits/sequential/gen2.parquet --old models/sequential/bct/gen1 \
        --out models/sequential/bct/gen2

With ``--scenario``, generation 0 trains the scenario's old architecture on
``data/splits/<scenario>/old_train.parquet`` and generation ≥ 1 its new architecture on
``new_train.parquet``; ``--split`` and ``--architecture`` override either (sequential upgrades use
the ``default`` architecture unless told otherwise). ``--strategy`` names an entry of ``strategies``
in params.yaml. An interrupted run resumes from its last finished epoch when started again.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.models import CARD_FILE
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging
from modelupgrade.training import train_model
# A name of this module that run() passes on: tests replace the image decoder here.
from modelupgrade.training.generation import load_split_images as load_images
from modelupgrade.training.generation import training_arguments, training_metrics


def run(
    params: Params,
    out: str | Path,
    generation: int,
    scenario: str | None = None,
    strategy: str | None = None,
    old: str | Path | None = None,
    split: str | Path | None = None,
    architecture: str | None = None,
    resume_dir: str | Path | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Train the model and save it to ``out``; returns its card."""
    asked = {"out": out, "generation": generation, "scenario": scenario, "strategy": strategy, "old": old,
             "split": split, "architecture": architecture}
    with track_stage("train", params, run_name=f"train@{out}", arguments=asked) as stage:
        training_job = training_arguments(
            params, out, generation, scenario=scenario, strategy=strategy, old=old, split=split,
            architecture=architecture, resume_dir=resume_dir, progress=progress, load_images=load_images,
        )
        if scenario is not None:
            stage.set_tags({"scenario": scenario})
        stage.log_params({
            "seed": training_job["seed"], "training": params.training, "strategy": training_job["strategy_params"],
            "architecture": {"name": training_job["architecture_name"], **training_job["architecture"].model_dump()},
        })
        card = train_model(**training_job)
        stage.log_metrics(training_metrics(card))
        stage.log_artifact(Path(out) / CARD_FILE, "model")
    return card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scenario", help="scenario of params.yaml (picks split and architecture)")
    parser.add_argument("--generation", type=int, required=True, help="0 for the old model, ≥ 1 for a new one")
    parser.add_argument("--strategy", help="entry of 'strategies' in params.yaml (generation ≥ 1)")
    parser.add_argument("--old", help="directory of the previous generation's model (generation ≥ 1)")
    parser.add_argument("--split", help="training split parquet (overrides the scenario's)")
    parser.add_argument("--architecture", help="entry of 'architectures' (overrides the scenario's)")
    parser.add_argument("--resume-dir", help="where epoch checkpoints go (default: models/.../.<name>.resume)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: only on a terminal)")
    parser.add_argument("--out", required=True, help="output model directory (checkpoint.pt, card.json)")
    parser.add_argument("--embed-split", nargs="+", default=[],
                        help="after training, embed these split files (as stages.embed does, in this process)")
    parser.add_argument("--embed-dir", help="directory of the --embed-split outputs: <embed-dir>/<split stem>.npy")
    parser.add_argument("--embed-logits", action="store_true",
                        help="with --embed-split: also write <stem>_logits.npy (the classifier's logits)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if bool(args.embed_split) != bool(args.embed_dir):
        raise UserError("--embed-split and --embed-dir go together", hint="give both, or neither")
    setup_logging()
    params = load_params(args.params)
    run(
        params, args.out, args.generation, scenario=args.scenario, strategy=args.strategy,
        old=args.old, split=args.split, architecture=args.architecture, resume_dir=args.resume_dir,
        progress=args.progress,
    )
    if args.embed_split:
        # The pipeline embeds each model right after training it: one interpreter start, not two.
        import stages.embed

        stages.embed.run(params, args.out, args.embed_split, out_dir=args.embed_dir, logits=args.embed_logits)


if __name__ == "__main__":
    main()
