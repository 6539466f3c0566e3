"""The convergence gate as the evaluation applies it: each evaluated model's fit (written beside its
embeddings by the training stage) and each trained head's alignment, judged against
``evaluation.convergence``. The records go into the scenario's summary, where the claims read them.
"""

from __future__ import annotations

import math
from pathlib import Path

from modelupgrade.config.evaluation import ConvergenceGateParams
from modelupgrade.evaluation.summary import Convergence
from modelupgrade.io import read_json
from modelupgrade.json_data import JsonObject, number_at, numbers_at
from modelupgrade.training.convergence import FIT_FILE, TrainingFit, judge_fit


def model_convergence(embeddings_dir: Path, gate: ConvergenceGateParams) -> Convergence | None:
    """The gate's verdict on the model whose embeddings are in ``embeddings_dir``; None where no fit
    was recorded (an adopted model, trained elsewhere)."""
    path = embeddings_dir / FIT_FILE
    if not path.is_file():
        return None
    fit = TrainingFit.from_dict(read_json(path))
    verdict = judge_fit(fit, gate)
    statistics = {**fit.as_dict(), "loss_ratio": fit.loss_ratio}
    return Convergence(
        kind="model",
        statistics={k: float(v) for k, v in statistics.items()},
        passed=verdict.passed,
        reasons=list(verdict.reasons),
    )


def head_convergence(
    training: JsonObject,
    gate: ConvergenceGateParams,
    training_free: bool,
    aligns: bool,
    held_out_alignment: float | None = None,
) -> Convergence:
    """The gate's verdict on a head from its card's training record, by what its kind trains for:

    - a head trained jointly with its new model (DMU's ψ) is the model's: its record passes here
      and the claims read the model's;
    - a regression head (``Head.aligns``: FCT, FastFill, BiCT, RQT) must align its outputs with the
      embeddings they map to on its own training pairs (mean cosine);
    - a head trained through a classifier or a batch metric (DMU standalone, MCL, Seo et al.'s
      full method) must have left its starting loss and flattened out: the last tenth of its epochs
      moved the loss by at most ``max_late_change`` of its whole descent;
    - a training-free adapter's alignment is what its closed form achieves, shown but not gated;
      an iterative one (the residual MLP, which starts from its closed form) must not have lost
      ground on where it started.

    Every loss must stay finite. A head that aligns (a regression head or an adapter) also
    records ``held_out_alignment``, the same statistic on images it never trained on, where the
    evaluation measured it: shown, not gated (the gate asks whether the head trained)."""
    alignment = float(number_at(training, "fit_cosine", math.nan))
    losses = [float(x) for x in numbers_at(training, "epoch_losses")]
    statistics = {"alignment": alignment, "epochs": float(len(losses))}
    if held_out_alignment is not None and (aligns or training_free):
        statistics["held_out_alignment"] = held_out_alignment
    if losses:
        statistics.update(loss_start=losses[0], loss_end=losses[-1])
    reasons = []
    if training.get("mode") == "joint":
        pass
    elif training_free:
        if len(losses) > 1 and not losses[-1] <= losses[0]:
            reasons.append(
                f"its loss rose from {losses[0]:.3g} to {losses[-1]:.3g} over its training"
            )
    elif aligns:
        if not alignment >= gate.min_head_alignment:
            reasons.append(
                f"its output's mean cosine to the embedding it maps to is {alignment:.2f} on its "
                f"training pairs (gate ≥ {gate.min_head_alignment:.2f})"
            )
    else:
        late = late_change(losses)
        statistics["late_change"] = late
        if not late <= gate.max_late_change:
            reasons.append(
                f"its loss still moves: the last tenth of its epochs changed it by "
                f"{100 * late:.0f} % of its whole descent "
                f"(gate ≤ {100 * gate.max_late_change:.0f} %)"
            )
    if not all(math.isfinite(x) for x in losses):
        reasons.append("its training loss is not finite")
    return Convergence(kind="head", statistics=statistics, passed=not reasons, reasons=reasons)


def late_change(losses: list[float]) -> float:
    """How much the last tenth of the epochs moved the mean loss (the last tenth's mean against
    the tenth before), as a fraction of the whole descent from the first epoch; NaN without a
    descent (the loss never fell) or too few epochs."""
    if len(losses) < 4:
        return math.nan
    tenth = max(1, len(losses) // 10)
    last = sum(losses[-tenth:]) / tenth
    before = sum(losses[-2 * tenth : -tenth]) / tenth
    descent = losses[0] - min(losses)
    return abs(before - last) / descent if descent > 0 else math.nan
