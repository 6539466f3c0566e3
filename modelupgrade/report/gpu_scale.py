"""The report's section "At GPU scale": the GPU study's results beside the CPU study's.

The GPU study (``modelupgrade gpu-study``, params/gpu-quick.yaml) runs the claim-bearing models at
a size the CPU cannot reach and leaves its results in ``results/gpu-quick`` (``run.json``, the
params it ran with, and each finished seed's metrics as a replicate keeps them). This section reads
them as the study's own results are read (``collect_results``), checks the papers' claims on them
with the same rules (``check_claims``) and sets, per scenario, M(old, old) and the independently
trained M(new, new), the convergence gate, and each claim's verdict beside the CPU study's, saying
where the two scales disagree. Where the folder holds no run it says so plainly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.config import Params
from modelupgrade.gpu_study import GpuStudyRun, read_run
from modelupgrade.replicates import replicate_layout, replicate_params
from modelupgrade.report.claims import Claim, check_claims
from modelupgrade.report.document import MISSING, Block, Details, Heading, Paragraph, Table
from modelupgrade.report.numbers import fixed, spread
from modelupgrade.report.results import StudyResults, collect_results

GPU_RESULTS = Path("results/gpu-quick")
HEADING = "At GPU scale"


@dataclass(frozen=True)
class GpuScale:
    """A GPU run read back: its record, its params, each finished seed's results and the claims."""

    record: GpuStudyRun
    params: Params
    seeds: list[StudyResults]
    claims: list[Claim]


def collect_gpu_scale(root: Path | None = None) -> GpuScale | None:
    """The GPU run under ``root`` (default ``GPU_RESULTS``), None where there is none."""
    root = root or GPU_RESULTS
    found = read_run(root)
    if found is None:
        return None
    record, params = found
    seeds = [
        collect_results(replicate_params(params, seed), replicate_layout(root, seed))
        for seed in record.seeds_finished
    ]
    claims = check_claims(seeds[0], seeds[1:]) if seeds else []
    return GpuScale(record, params, seeds, claims)


def gpu_scale_blocks(
    cpu_seeds: Sequence[StudyResults], cpu_claims: Sequence[Claim], root: Path | None = None
) -> list[Block]:
    """The section: the GPU run under ``root`` (default ``GPU_RESULTS``, relative to the project
    root) beside the CPU study (``cpu_seeds``: its own seed, then the replicates';
    ``cpu_claims``: its verdicts), or a paragraph saying it has not been run."""
    root = root or GPU_RESULTS
    gpu = collect_gpu_scale(root)
    if gpu is None or not gpu.seeds:
        return [Heading(HEADING, 2), Paragraph(_not_run(root, gpu))]
    return [
        Heading(HEADING, 2),
        Paragraph(_how_it_ran(gpu)),
        _levels_table(cpu_seeds, gpu.seeds),
        _gate_table(gpu.seeds),
        *_claims_blocks(cpu_claims, gpu.claims),
        *_timing_blocks(gpu.record),
    ]


def _not_run(root: Path, gpu: GpuScale | None) -> str:
    if gpu is None:
        return (
            f"The GPU-scale study has not been run: {root} holds no run. It is prepared "
            "(params/gpu-quick.yaml: ResNet-18 on 30,000 training images, the claim-bearing "
            "models at five seeds, one command of a lent GPU machine; see docs/gpu.md), "
            "but no GPU machine was available to the sessions so far. Every verdict "
            "above rests on the CPU study alone."
        )
    return (
        f"The GPU-scale study ran on {gpu.record.device} but no seed finished "
        f"({gpu.record.state}); every verdict above rests on the CPU study alone."
    )


def _how_it_ran(gpu: GpuScale) -> str:
    record, params = gpu.record, gpu.params
    architecture = params.architectures[
        params.scenarios[gpu.seeds[0].scenarios[0].name].new_architecture
    ]
    versions = record.versions
    images = params.dataset.max_train_per_class
    failed = f"; failed: {', '.join(record.failed)}" if record.failed else ""
    # A record still "running" was left by a process killed from outside (the hard timeout).
    state = "killed before it ended" if record.state == "running" else record.state
    return (
        f"The same claim-bearing models at a size the CPU cannot reach ({record.profile}): "
        f"{architecture.backbone} ({architecture.embedding_dim}-d), "
        f"{'every training image' if images is None else f'{images} training images a class'}, "
        f"{params.training.steps} SGD steps of {params.training.batch_size} per model, "
        f"evaluated as the CPU study is. Run on {record.device} (torch {versions.get('torch')}, "
        f"CUDA {versions.get('cuda')}) in {record.wall_seconds:.0f} s of its "
        f"{record.time_limit_seconds:.0f} s limit, {record.started}: seeds "
        f"{', '.join(map(str, record.seeds_finished))} of "
        f"{', '.join(map(str, record.seeds_planned))} finished ({state}{failed}). Numbers "
        "are mean ± standard deviation over the seeds; verdicts follow the rules of the claims "
        "above."
    )


def _levels(seeds: Sequence[StudyResults], scenario: str) -> tuple[list[float], list[float]]:
    """M(old, old) and the independent M(new, new) of ``scenario`` on each seed that has it."""
    runs = [sc.evaluation for study in seeds for sc in study.scenarios if sc.name == scenario]
    old = [ev.old_self for ev in runs if ev.old_self is not None and math.isfinite(ev.old_self)]
    new = [ev.oracle_self for ev in runs if ev.oracle_self is not None]
    return old, [value for value in new if math.isfinite(value)]


def _levels_table(cpu: Sequence[StudyResults], gpu: Sequence[StudyResults]) -> Table:
    rows = []
    for sc in gpu[0].scenarios:
        (cpu_old, cpu_new), (gpu_old, gpu_new) = _levels(cpu, sc.name), _levels(gpu, sc.name)
        rows.append(
            [
                sc.name,
                sc.metric,
                spread(cpu_old),
                spread(gpu_old),
                spread(cpu_new),
                spread(gpu_new),
                f"{len(cpu_old)} / {len(gpu_old)}",
            ]
        )
    return Table(
        [
            "scenario",
            "metric",
            "M(old, old) CPU",
            "M(old, old) GPU",
            "independent M(new, new) CPU",
            "independent M(new, new) GPU",
            "seeds CPU / GPU",
        ],
        rows,
    )


def _gate_table(gpu: Sequence[StudyResults]) -> Table:
    """Per scenario, how many of the models and heads the GPU run evaluated passed the convergence
    gate over all its seeds, and which did not."""
    rows = []
    for sc in gpu[0].scenarios:
        records = [
            (system, record)
            for study in gpu
            for other in study.scenarios
            if other.name == sc.name
            for system, record in other.evaluation.convergence.items()
        ]
        failed = sorted({system for system, record in records if not record.passed})
        passed = sum(record.passed for _, record in records)
        rows.append([sc.name, f"{passed} of {len(records)}", ", ".join(failed) or "none"])
    return Table(["scenario", "passed the convergence gate (all seeds)", "did not"], rows)


def _kind(verdict: str) -> str:
    """A verdict without its reason: holds, fails, inconclusive or not tested."""
    return verdict.split(" (")[0]


def _claims_blocks(cpu: Sequence[Claim], gpu: Sequence[Claim]) -> list[Block]:
    at_cpu = {claim.statement: claim for claim in cpu}
    at_gpu = {claim.statement: claim for claim in gpu}
    rows, disagree = [], []
    for i, statement in enumerate(dict.fromkeys([*at_cpu, *at_gpu]), 1):
        ours, other = at_cpu.get(statement), at_gpu.get(statement)
        verdict = MISSING if other is None else _kind(other.verdict)
        own = MISSING if ours is None else _kind(ours.verdict)
        same = verdict == own
        if not same:
            disagree.append(f"{i} ({own} on the CPU, {verdict} on the GPU)")
        rows.append(
            [
                f"{i}. {statement}",
                own,
                verdict,
                MISSING if other is None else (other.ours or MISSING),
                "yes" if same else "no",
            ]
        )
    summary = (
        "The two scales disagree on claim " + "; ".join(disagree) + "."
        if disagree
        else "Every claim's verdict is the same at both scales."
    )
    return [
        Table(["claim", "verdict CPU", "verdict GPU", "ours GPU", "same"], rows),
        Paragraph(summary),
        *(
            Details(f"{i}. At GPU scale: {claim.verdict}.", [claim.evidence])
            for i, claim in enumerate(gpu, 1)
        ),
    ]


def _timing_blocks(record: GpuStudyRun) -> list[Block]:
    """Each seed's wall time; per model, its training time and rate, mean over the seeds."""
    by_model: dict[tuple[str, str], list[tuple[float, float, int, int]]] = {}
    for run in record.seeds:
        for model in run.models:
            by_model.setdefault((model.scenario, model.model), []).append(
                (model.train_seconds, model.images_per_second, model.images, model.steps)
            )
    rows = [
        [
            scenario,
            model,
            runs[0][2],
            runs[0][3],
            fixed(sum(seconds for seconds, *_ in runs) / len(runs), 1),
            fixed(sum(rate for _, rate, *_ in runs) / len(runs), 0),
        ]
        for (scenario, model), runs in by_model.items()
    ]
    seeds = ", ".join(f"seed {run.seed} {run.seconds:.0f} s" for run in record.seeds)
    return [
        Paragraph(
            f"Wall time per seed, training, evaluation and backfill simulation together: {seeds} "
            f"(data preparation {record.data_seconds:.0f} s). Training time and rate per model, "
            "mean over the seeds:"
        ),
        Table(["scenario", "model", "training images", "steps", "train s", "images/s"], rows),
    ]


if __name__ == "__main__":
    # python -m modelupgrade.report.gpu_scale [DIR]: the section of a GPU run alone (no CPU side).
    import sys

    from modelupgrade.report.document import render_markdown

    where = Path(sys.argv[1]) if len(sys.argv) > 1 else GPU_RESULTS
    print(render_markdown(HEADING, gpu_scale_blocks([], [], where)))
