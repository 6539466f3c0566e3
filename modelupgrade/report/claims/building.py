"""How a claim is judged from its checks on each scenario and seed (``claim_entry``): matched across
seeds, their p-values adjusted by Holm's rule, the convergence gate and the premises applied."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence

from modelupgrade.report.claims.checks import (
    Check,
    Claim,
    ScenarioChecks,
    Scope,
    SeededCheck,
)
from modelupgrade.report.claims.vocabulary import (
    ANCHOR_NOT_CONVERGED,
    SHOWN,
)
from modelupgrade.report.results import ScenarioResults, StudyResults
from modelupgrade.report.statistics import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTED,
    claim_verdict,
    holm,
)


def claim_entry(
    *, statement: str, source: str, scope: Scope, paper: str | None, missing: str
) -> Callable[[ScenarioChecks], Callable[[Sequence[StudyResults]], Claim]]:
    """A claim from its checks on each scenario and seed: it holds where every measured check in
    its scope holds, fails where one fails, and is inconclusive otherwise; with no check in scope
    (``missing`` says why), or none measured, it is not tested."""

    def from_checks(checks_of: ScenarioChecks) -> Callable[[Sequence[StudyResults]], Claim]:
        @functools.wraps(checks_of)
        def claim(seeds: Sequence[StudyResults]) -> Claim:
            # A check is the same check on every seed by its key (and, should two checks of one
            # seed share a key, by its place among them).
            inside: dict[tuple[str, int], list[Check]] = {}
            outside: dict[tuple[str, int], list[Check]] = {}
            for results in seeds:
                seen: Counter[str] = Counter()
                for sc in results.scenarios:
                    side = inside if sc.kind in scope.scenarios else outside
                    for check in checks_of(results, sc):
                        seen[check.key] += 1
                        if not check.excluded and not _converged(sc, check.systems):
                            check = check._replace(excluded=ANCHOR_NOT_CONVERGED)
                        side.setdefault((check.key, seen[check.key]), []).append(check)
            checks = _holm_adjusted([SeededCheck(tuple(d), len(seeds)) for d in inside.values()])
            others = _holm_adjusted([SeededCheck(tuple(d), len(seeds)) for d in outside.values()])
            verdict = claim_verdict([check.verdict for check in checks])
            reasons = [c.why_not_tested or "" for c in checks if c.measured and not c.tested]
            if verdict == NOT_TESTED and reasons:
                verdict = f"{NOT_TESTED} ({'; '.join(dict.fromkeys(reasons))})"
            elif verdict == HOLDS and any(ANCHOR_NOT_CONVERGED in r for r in reasons):
                # A part of the claim could not be tested for a model that did not train: what
                # was tested cannot carry the whole claim.
                verdict = INCONCLUSIVE
            return Claim(
                statement=statement,
                source=source,
                scope=scope,
                paper=paper,
                verdict=verdict,
                ours=_ours(checks, others),
                seeds=max((check.test.n for check in checks), default=0),
                checks=checks,
                outside=others,
                missing=missing,
            )

        return claim

    return from_checks


def _converged(sc: ScenarioResults, systems: Sequence[str]) -> bool:
    """Whether every model and head a check rests on passed the convergence gate (one the
    evaluation did not measure, such as an adopted model, is not held against it)."""
    return all(sc.evaluation.converged(system) is not False for system in systems)


def _holm_adjusted(checks: Sequence[SeededCheck]) -> tuple[SeededCheck, ...]:
    """The checks with their p-values adjusted by Holm's rule across those that can be tested."""
    p_values = [check.test.p if check.testable else math.nan for check in checks]
    return tuple(
        dataclasses.replace(check, adjusted_p=adjusted)
        for check, adjusted in zip(checks, holm(p_values), strict=True)
    )


def _ours(inside: Sequence[SeededCheck], outside: Sequence[SeededCheck]) -> str | None:
    """The numbers a verdict rests on, short enough for a table cell."""
    measured = [check for check in inside if check.measured]
    if not measured:
        elsewhere = [check for check in outside if check.measured]
        if not elsewhere:
            return None
        more = f" (+{len(elsewhere) - 1} more)" if len(elsewhere) > 1 else ""
        return f"outside the scope only: {elsewhere[0].ours}{more}"
    if len(measured) <= SHOWN:
        text = "; ".join(check.ours for check in measured)
    else:
        held = sum(check.verdict == HOLDS for check in measured)
        unsure = [check for check in measured if check.verdict == INCONCLUSIVE]
        failing = [check for check in measured if check.verdict == FAILS]
        text = f"{held}/{len(measured)} hold"
        text += f", {len(unsure)} inconclusive" if unsure else ""
        example = (failing or unsure)[:1]
        text += f"; e.g. {example[0].ours}" if example else ""
    unmeasured = len(inside) - len(measured)
    return text + (f"; {unmeasured} not measured" if unmeasured else "")
