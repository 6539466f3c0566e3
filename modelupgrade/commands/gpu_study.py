"""The study at GPU scale, in one process within a time limit. The work is
``modelupgrade.gpu_study``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelupgrade.config import DEFAULT_PARAMS_FILE, ParamsFile
from modelupgrade.gpu_study import GPU_QUICK_OVERLAY, RESULTS_ROOT, GpuStudyRun

# Seconds: what one lent GPU machine's command leaves the study (see params/gpu-quick.yaml).
DEFAULT_TIME_LIMIT = 390.0


def gpu_study(
    params: ParamsFile = DEFAULT_PARAMS_FILE,
    overlay: Sequence[Path] = (GPU_QUICK_OVERLAY,),
    out: Path = RESULTS_ROOT,
    time_limit: float = DEFAULT_TIME_LIMIT,
    dataset_root: Path | None = None,
) -> GpuStudyRun:
    """Train, evaluate and simulate the study's claim-bearing models at every seed that fits.

    Needs no DVC, MLflow, Prefect, FAISS or Great Expectations: what a lent GPU machine has, and
    pydantic (scripts/gpu_study.sh carries it). The overlay's seed runs first, then
    replicates.seeds; a seed starts only if it can end within the time limit, and one under way at
    the limit is dropped. Writes <out>/params.yaml, <out>/run.json (device, versions, wall time
    and images/s per model, how the run ended) and <out>/seed-<seed>/metrics/<scenario>/, which
    `make repro`'s report reads from results/gpu-quick. Exits non-zero where no seed finished.

    Args:
        params: the params file the overlays apply over
        overlay: the GPU profile, and further overlays applied over it in turn
        out: where the results go; a previous run's results there are removed
        time_limit: seconds the whole run may take, data preparation included
        dataset_root: the dataset's folder, where it is not params.yaml's dataset.root
    """
    from modelupgrade.gpu_study import gpu_study_params, run_gpu_study

    loaded = gpu_study_params(Path(params), overlay, dataset_root)
    return run_gpu_study(loaded, out, time_limit, profile=" + ".join(map(str, overlay)))
