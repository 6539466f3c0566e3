"""The study again at further training seeds: the replicates stage. The work is
``modelupgrade.replicates``'s."""

from __future__ import annotations

from pathlib import Path

from modelupgrade.commands.results import WrittenFiles
from modelupgrade.config import Params
from modelupgrade.replicates import REPLICATES_ROOT


def replicates(params: Params, out: Path = REPLICATES_ROOT) -> WrittenFiles:
    """Train, evaluate and simulate what the claims rest on again at each of replicates.seeds.

    For each seed, the scenarios, strategies and heads under replicates.scenarios are trained on
    the study's splits (data/splits), evaluated and, where asked, their backfill simulated, as the
    study's stages do; <out>/seed-<seed>/metrics/<scenario>/ then holds what metrics/<scenario>/
    holds for the study's own seed. The seeds run side by side (replicates.workers processes).

    Args:
        params: the params file: the replicates section and everything the study's stages read
        out: root of the seeds' results (default: replicates)
    """
    from modelupgrade.registry import track_stage
    from modelupgrade.replicates import run_replicates

    with track_stage("replicates", params, arguments={"out": out}) as stage:
        stage.log_params({"replicates": params.replicates})
        done = run_replicates(params, out)
    return WrittenFiles(done)
