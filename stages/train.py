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
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from modelupgrade.config import Params, load_params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.io import file_sha256
from modelupgrade.runtime import select_device, setup_logging
from modelupgrade.training import train_model

log = logging.getLogger("stages.train")

SPLITS_DIR = Path("data/splits")


def load_images(frame: pd.DataFrame, params: Params) -> torch.Tensor:
    from modelupgrade.data import load_images as decode

    return decode(frame, params.dataset)


def apply_cpu_threads(params: Params) -> None:
    if params.training.cpu_threads is not None:
        torch.set_num_threads(params.training.cpu_threads)


def read_split(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"split file {path} does not exist", hint="run the split stage first")
    frame = pd.read_parquet(path)
    if "label" not in frame.columns or frame.empty:
        raise UserError(f"{path} is empty or has no 'label' column", hint="pass a split file (rows of the manifest)")
    return frame


def resolve_inputs(
    params: Params, scenario: str | None, generation: int, split: str | Path | None, architecture: str | None
) -> tuple[Path, str]:
    """The training split and architecture name for this generation."""
    if scenario is not None:
        scenario_params = params.scenario(scenario)
        default_arch = scenario_params.old_architecture if generation == 0 else scenario_params.new_architecture
        default_split = SPLITS_DIR / scenario / ("old_train.parquet" if generation == 0 else "new_train.parquet")
    else:
        default_arch, default_split = "default", None
    split_path = Path(split) if split is not None else default_split
    if split_path is None:
        raise UserError("no training split given", hint="pass --scenario <name> or --split <parquet>")
    arch_name = architecture or default_arch
    if arch_name not in params.architectures:
        raise UserError(
            f"unknown architecture {arch_name!r}", hint=f"params.yaml defines: {', '.join(params.architectures)}"
        )
    return split_path, arch_name


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
    if generation < 0:
        raise UserError(f"--generation must be ≥ 0, got {generation}")
    split_path, arch_name = resolve_inputs(params, scenario, generation, split, architecture)
    strategy_params = None
    if strategy is not None:
        if strategy not in params.strategies:
            raise UserError(f"unknown strategy {strategy!r}", hint=f"params.yaml defines: {', '.join(params.strategies)}")
        strategy_params = params.strategies[strategy]
    apply_cpu_threads(params)
    frame = read_split(split_path)
    images = load_images(frame, params)
    labels = torch.tensor(frame["label"].to_numpy(dtype="int64"))
    log.info("training %s on %s: %d images, %d classes", out, split_path, len(frame), labels.unique().numel())
    return train_model(
        architecture=params.architectures[arch_name],
        architecture_name=arch_name,
        training=params.training,
        images=images,
        labels=labels,
        out_dir=out,
        generation=generation,
        seed=params.seed + generation,
        device=select_device(params.device),
        strategy_name=strategy,
        strategy_params=strategy_params,
        old_model_dir=old,
        data={"scenario": scenario, "split": str(split_path), "split_sha256": file_sha256(split_path)},
        resume_dir=resume_dir,
        progress=progress,
    )


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
