"""Did every model and head train? The convergence gate's records as tables a person reads.

Per scenario, every model (gen0, gen1-<strategy>) and every trained head and training-free adapter
the evaluation measured (``ScenarioEvaluation.convergence``): its fit statistics on the study's
own seed, the gate's verdict there, and on how many of the seeds that measured it it passed; the
reasons of every failure below the table. Then FastFill's ψ beside FCT's on the same pair: the
mean cosine of ψ(old) to φ_new on their training pairs, over the seeds (the two objectives differ:
see the paragraph the table comes with).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from modelupgrade.evaluation.summary import Convergence
from modelupgrade.report.claims.vocabulary import FASTFILL_HEAD_KIND, FCT_HEAD_KIND
from modelupgrade.report.document import MISSING, Block, BulletList, Heading, Paragraph, Table
from modelupgrade.report.lead import scenario_runs
from modelupgrade.report.numbers import M_DIGITS, PERCENT_DIGITS, fixed, spread
from modelupgrade.report.results import ScenarioResults, StudyResults


def _kind(sc: ScenarioResults, name: str, record: Convergence) -> str:
    if record.kind == "model":
        return "model"
    if name in sc.head_kinds:
        return f"trained head ({sc.head_kinds[name]})"
    adapter = sc.evaluation.sources.get(name, {}).get("kind")
    return f"adapter ({adapter})" if adapter else "head"


def _order(sc: ScenarioResults, name: str) -> tuple[int, str]:
    record = sc.evaluation.convergence[name]
    rank = 0 if record.kind == "model" else 1 if name in sc.head_kinds else 2
    return rank, name


def _loss(statistics: dict[str, float]) -> str:
    start, end = statistics.get("loss_start"), statistics.get("loss_end")
    if start is None or end is None:
        return MISSING
    return f"{start:.3g} → {end:.3g}"


def _length(record: Convergence) -> str:
    statistics = record.statistics
    if record.kind == "model":
        steps = statistics.get("steps")
        return MISSING if steps is None else f"{steps:.0f} steps"
    epochs = statistics.get("epochs", 0.0)
    if not epochs:
        return "closed form"
    return f"{epochs:.0f} epoch{'' if epochs == 1 else 's'}"


def _statistic(record: Convergence, name: str, digits: int = M_DIGITS) -> str:
    value = record.statistics.get(name)
    return MISSING if value is None else fixed(value, digits)


def _passed_on(runs: Sequence[ScenarioResults], name: str) -> str:
    verdicts = [
        sc.evaluation.convergence[name].passed for sc in runs if name in sc.evaluation.convergence
    ]
    return f"{sum(verdicts)}/{len(verdicts)}"


def fit_row(sc: ScenarioResults, runs: Sequence[ScenarioResults], name: str) -> list[Any]:
    record = sc.evaluation.convergence[name]
    late = record.statistics.get("late_change")
    return [
        name,
        _kind(sc, name, record),
        _length(record),
        _loss(record.statistics),
        _statistic(record, "prototype_accuracy"),
        _statistic(record, "classifier_agreement"),
        _statistic(record, "collapse"),
        _statistic(record, "alignment"),
        MISSING if late is None else fixed(100 * late, PERCENT_DIGITS),
        "passes" if record.passed else "fails",
        _passed_on(runs, name),
    ]


def _seed_name(study: StudyResults, index: int) -> str:
    return f"seed {study.seed}" if study.seed is not None else f"seed {index + 1}"


def failures(seeds: Sequence[StudyResults], scenario: str) -> list[str]:
    """Why each model or head that failed the gate on some seed failed, seed by seed."""
    lines = []
    for index, study in enumerate(seeds):
        for sc in study.scenarios:
            if sc.name != scenario:
                continue
            for name, record in sorted(sc.evaluation.convergence.items()):
                if not record.passed:
                    reasons = "; ".join(record.reasons) or "no reason recorded"
                    lines.append(f"{name}, {_seed_name(study, index)}: {reasons}")
    return lines


FIT_COLUMNS = [
    "model or head",
    "what",
    "trained for",
    "loss first → last epoch",
    "nearest-prototype accuracy",
    "classifier agreement",
    "collapse",
    "alignment",
    "late change %",
    "gate (this seed)",
    "passed on seeds",
]


def fit_blocks(seeds: Sequence[StudyResults]) -> list[Block]:
    """The section: what the statistics mean, FastFill's alignment beside FCT's, then per scenario
    the table of every model and head with its failures."""
    study = seeds[0] if seeds else None
    if study is None or not any(sc.evaluation.convergence for sc in study.scenarios):
        return []
    blocks: list[Block] = [
        Heading("Did every model and head train?", 2),
        Paragraph(
            "A number means something only if the model behind it converged. Each model is "
            "measured on its own training images after training: its loss over the first and "
            "the last epoch, nearest-prototype accuracy (each image's class is the class whose "
            "mean embedding is nearest), classifier agreement (how often its classifier picks "
            "that same class; near chance when the classifier points away from the "
            "embeddings), and collapse (the embeddings' mean cosine to their mean direction; 1: "
            "every image on one point). A head that maps embeddings (FCT, FastFill, BiCT, RQT, "
            "the adapters) is measured by its alignment, the mean cosine of its output to the "
            "embedding it maps to on its training pairs; one trained through a classifier or a "
            "batch metric by its late change, how much the last tenth of its epochs moved its "
            "loss, as a share of its whole descent. The gate (params.yaml, "
            "evaluation.convergence) turns them into a verdict; a claim's check resting on a "
            "model or head that failed it at a seed leaves that seed out, and is not tested "
            "where none is left. The table gives the study's own seed; the last column the "
            "seeds that measured it."
        ),
    ]
    blocks += alignment_blocks(seeds)
    for sc in study.scenarios:
        records = sc.evaluation.convergence
        if not records:
            continue
        runs = scenario_runs(seeds, sc.name)
        names = sorted(records, key=lambda name: _order(sc, name))
        blocks += [
            Heading(f"Models and heads of {sc.name}", 3),
            Table(FIT_COLUMNS, [fit_row(sc, runs, name) for name in names]),
        ]
        failed = failures(seeds, sc.name)
        if failed:
            blocks += [Paragraph("Failed the gate:"), BulletList(failed)]
        else:
            blocks.append(Paragraph(f"Every model and head of {sc.name} passed on every seed."))
    return blocks


# The alignment statistics the table sets side by side: on the head's own training images (the
# gate's) and on the evaluation's gallery, which it never trained on.
ALIGNMENT_STATISTICS = (("alignment", "training"), ("held_out_alignment", "gallery (held out)"))


def _alignment(sc: ScenarioResults, name: str | None, statistic: str) -> float:
    """A head's alignment ``statistic`` on one seed (NaN where it was not measured there)."""
    record = sc.evaluation.convergence.get(name or "")
    return math.nan if record is None else record.statistics.get(statistic, math.nan)


def _alignments(runs: Sequence[ScenarioResults], name: str | None, statistic: str) -> list[float]:
    """A head's alignment ``statistic`` on each seed that measured it."""
    values = [_alignment(sc, name, statistic) for sc in runs]
    return [value for value in values if math.isfinite(value)]


def alignment_blocks(seeds: Sequence[StudyResults]) -> list[Block]:
    """FastFill's ψ beside FCT's: per scenario, new model and set of images, the mean cosine of
    ψ(old) to φ_new."""
    rows = []
    for sc in seeds[0].scenarios:
        runs = scenario_runs(seeds, sc.name)
        fastfill, fct = sc.heads_of_kind(FASTFILL_HEAD_KIND), sc.heads_of_kind(FCT_HEAD_KIND)
        for strategy in dict.fromkeys([*fastfill, *fct]):
            for statistic, images in ALIGNMENT_STATISTICS:
                ours = _alignments(runs, fastfill.get(strategy), statistic)
                theirs = _alignments(runs, fct.get(strategy), statistic)
                if statistic != "alignment" and not (ours or theirs):
                    continue  # held out: not measured (a summary written before it was)
                pairs = [
                    (
                        _alignment(run, fastfill.get(strategy), statistic),
                        _alignment(run, fct.get(strategy), statistic),
                    )
                    for run in runs
                ]
                paired = [a - b for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
                rows.append(
                    [
                        sc.name,
                        strategy,
                        images,
                        spread(ours) if ours else "not trained here",
                        spread(theirs) if theirs else "not trained here",
                        spread(paired, sign=True) if paired else MISSING,
                        max(len(ours), len(theirs)),
                    ]
                )
    if not rows:
        return []
    return [
        Heading("FastFill's ψ beside FCT's", 3),
        Paragraph(
            "The mean cosine of ψ(φ_old(x)) to φ_new(x), mean ± sd over the seeds, over each "
            "head's training images (what the convergence gate reads) and over the evaluation's "
            "gallery images, which neither head trained on. FastFill's Eq. 3 sums FCT's squared-"
            "norm alignment with the new classifier's loss on ψ(φ_old(x)), and its Eq. 5 divides "
            "each pair's sum by σ², which learns to track that sum: so FastFill minimises about "
            "the logarithm of each pair's loss where FCT minimises the squared error itself, "
            "which the mean cosine follows. Its ψ need not align as well on this statistic; what "
            "FastFill claims is a better backfill: claims 7 (its σ² order), 8 (FastFill against "
            "FCT) and 9 (its loss alone, both in a random order) judge that. Where one of them is"
            " not trained in a scenario, there is nothing to compare."
        ),
        Table(
            ["scenario", "new model", "images", "FastFill ψ", "FCT ψ", "FastFill − FCT", "seeds"],
            rows,
        ),
    ]
