"""A claim's checks: one comparison on one seed (``Check``), the same comparison over the seeds with
its paired test (``SeededCheck``), and the claim they make up (``Claim``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from modelupgrade.json_data import JsonObject
from modelupgrade.report.results import ScenarioResults, StudyResults
from modelupgrade.report.statistics import (
    FAILS,
    HOLDS,
    MIN_SEEDS,
    NOT_TESTED,
    PairedTest,
    check_verdict,
)


class CurveRef(NamedTuple):
    """A backfill curve a check compares, in one of its metrics: what the report draws with the
    seeds' band."""

    scenario: str
    system: str
    policy: str
    mode: str
    metric: str


class Check(NamedTuple):
    """One check of a claim on one scenario, from one seed's results: what it compares (``key``,
    the same on every seed), how far it is from its threshold (``margin``: > 0 where it holds),
    the numbers it compared as the table shows them (``ours``), the evidence in full, and the
    numbers themselves, shown with ``digits`` decimals. A NaN among them makes the check not
    measured: the claim leaves it out of its verdict."""

    key: str
    margin: float
    ours: str
    evidence: str
    compared: tuple[float, ...]
    digits: int = 4
    # The models and heads the compared numbers come from (names as the evaluation knows them):
    # where one did not pass the convergence gate, this seed's draw is left out of the test.
    systems: tuple[str, ...] = ()
    # Why this seed's draw is left out of the test ("": it is not): a model it rests on did not
    # converge (set by the claim from the scenario's records), or the claim's premise does not
    # hold on this seed (set by the check).
    excluded: str = ""
    # The standard error of the margin over a resampling of the test queries (NaN: not measured).
    query_se: float = math.nan
    # The backfill curves the check compares (none for a check of the evaluation's numbers).
    curves: tuple[CurveRef, ...] = ()

    @property
    def measured(self) -> bool:
        return not any(math.isnan(number) for number in (*self.compared, self.margin))


@dataclass(frozen=True)
class SeededCheck:
    """One check over the training seeds: its draw on each seed that measured it (the study's own
    seed first) out of the ``seeds`` the study ran, with its verdict.

    The test uses the draws whose models all passed the convergence gate: a paired t-test of their
    margins (``modelupgrade.report.statistics``), its p-value adjusted by Holm's rule across the
    claim's checks (``adjusted_p``, set by the claim)."""

    draws: tuple[Check, ...]
    seeds: int
    adjusted_p: float = math.nan

    @property
    def key(self) -> str:
        return self.draws[0].key

    @property
    def measured(self) -> tuple[Check, ...]:
        return tuple(draw for draw in self.draws if draw.measured)

    @property
    def tested(self) -> tuple[Check, ...]:
        """The measured draws whose models converged and whose premise held: what the test
        rests on."""
        return tuple(draw for draw in self.measured if not draw.excluded)

    @property
    def unconverged(self) -> int:
        """Measured draws left out of the test (a model did not converge, or the premise)."""
        return sum(bool(draw.excluded) for draw in self.measured)

    @property
    def test(self) -> PairedTest:
        return PairedTest.of([draw.margin for draw in self.tested])

    @property
    def margin(self) -> Spread:
        return Spread.of([draw.margin for draw in self.tested])

    @property
    def testable(self) -> bool:
        """Measured on enough seeds whose models converged for a test."""
        return len(self.tested) >= MIN_SEEDS

    @property
    def verdict(self) -> str:
        if not self.measured:
            return NOT_TESTED
        if not self.tested:
            return NOT_TESTED
        return check_verdict(self.test, self.adjusted_p)

    @property
    def why_not_tested(self) -> str | None:
        if not self.measured:
            return "not measured"
        if not self.tested:
            return " and ".join(dict.fromkeys(draw.excluded for draw in self.measured))
        return None

    def numbers(self) -> list[Spread]:
        """Each compared number's mean and standard deviation over the tested seeds."""
        tested = self.tested
        return [Spread.of([draw.compared[i] for draw in tested]) for i in range(_width(tested))]

    @property
    def query_se(self) -> float:
        """The mean over the tested seeds of the margin's query-bootstrap standard error."""
        values = [d.query_se for d in self.tested if not math.isnan(d.query_se)]
        return statistics.fmean(values) if values else math.nan

    @property
    def ours(self) -> str:
        """The table's text: the study's own seed's, each compared number replaced by its mean ±
        sd over the tested seeds (the key and the means where that text does not show them all)."""
        first = self.draws[0]
        if len(self.tested) < 2:
            return first.ours
        spreads = [spread.text(first.digits) for spread in self.numbers()]
        shown = _replace_in_order(first.ours, first.compared, spreads, first.digits)
        return shown if shown is not None else f"{self.key}: {' vs '.join(spreads)}"

    @property
    def line(self) -> str:
        first = self.draws[0]
        reason = self.why_not_tested
        if reason is not None:
            if self.unconverged:
                reason += f" (on each of its {self.unconverged} seeds)"
            return f"{self.key}: not tested: {reason}. The study's own seed: {first.evidence}"
        test, digits = self.test, first.digits
        numbers = " vs ".join(spread.text(digits) for spread in self.numbers())
        spread = f"difference {test.mean:+.{digits}f} ± {test.sd:.{digits}f} (seeds' sd)"
        if not math.isnan(self.query_se):
            spread += f", ± {self.query_se:.{digits}f} (query bootstrap, one seed)"
        statistic = (
            f"paired t = {test.t:.2f}, p {_p(test.p)}, Holm-adjusted p {_p(self.adjusted_p)}"
            if test.n >= 2
            else "one seed: no test"
        )
        left_out = "".join(
            f"; seed {i + 1} left out: {draw.excluded}"
            for i, draw in enumerate(self.measured)
            if draw.excluded
        )
        own = first.evidence + ("" if first.measured else " (not measured)")
        return (
            f"{self.key}: {numbers} over {test.n} of {self.seeds} seeds, {spread}; {statistic}: "
            f"{self.verdict}{left_out}. The study's own seed: {own}"
        )

    def as_dict(self) -> JsonObject:
        numbers, test = self.numbers(), self.test
        return {
            "check": self.key,
            "seeds": test.n,
            "seeds_left_out": self.unconverged,
            "mean": [_finite(spread.mean) for spread in numbers],
            "sd": [_finite(spread.sd) for spread in numbers],
            "difference_mean": _finite(test.mean),
            "difference_sd": _finite(test.sd),
            "difference_ci95": [_finite(test.low), _finite(test.high)],
            "query_bootstrap_se": _finite(self.query_se),
            "t": _finite(test.t),
            "p": _finite(test.p),
            "p_holm": _finite(self.adjusted_p),
            "verdict": self.verdict,
        }


def _p(p: float) -> str:
    """A p-value after its relation: "= 0.123", "< 0.001", or "–" where there is none."""
    if math.isnan(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


class Spread(NamedTuple):
    """Mean and sample standard deviation of a number over seeds (sd NaN below two)."""

    mean: float
    sd: float
    count: int  # type: ignore[assignment]  # a field named like tuple.count, which it shadows

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(math.nan, math.nan, 0)
        array = np.asarray(values, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            sd = float(array.std(ddof=1)) if len(values) > 1 else math.nan
        return cls(float(array.mean()), sd, len(values))

    def text(self, digits: int) -> str:
        if self.count < 2:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}"


def _replace_in_order(
    text: str, numbers: Sequence[float], replacements: Sequence[str], digits: int
) -> str | None:
    """``text`` with each of ``numbers``, as shown with ``digits`` decimals, replaced in turn by
    its replacement; None where one is not found after the one before."""
    if len(numbers) != len(replacements):
        return None
    parts, start = [], 0
    for number, replacement in zip(numbers, replacements, strict=True):
        shown = f"{number:.{digits}f}"
        at = text.find(shown, start)
        if at < 0:
            return None
        parts += [text[start:at], replacement]
        start = at + len(shown)
    return "".join(parts) + text[start:]


def _finite(number: float) -> float | None:
    """A number for strict JSON: None where it is not finite (no spread from one seed)."""
    return number if math.isfinite(number) else None


def _width(draws: Sequence[Check]) -> int:
    return min((len(draw.compared) for draw in draws), default=0)


@dataclass(frozen=True)
class Scope:
    """Where a paper states a claim: the scenario kinds, the metric, the protocol or ordering, and
    why the other scenario kinds are not checked."""

    scenarios: tuple[str, ...]
    metric: str
    protocol: str
    elsewhere: str

    def as_dict(self) -> JsonObject:
        return {
            "scenarios": list(self.scenarios),
            "metric": self.metric,
            "protocol": self.protocol,
            "elsewhere": self.elsewhere,
        }


@dataclass(frozen=True)
class Claim:
    statement: str
    source: str  # the paper, table or section
    scope: Scope
    paper: str | None  # the paper's own numbers, None where it gives none (figures only)
    verdict: str  # holds, fails, inconclusive or not tested
    ours: str | None  # this study's numbers the verdict rests on, short; None: none
    seeds: int  # how many training seeds those numbers rest on (the most any check has)
    checks: tuple[SeededCheck, ...]  # the checks in scope
    outside: tuple[SeededCheck, ...]  # the checks outside the scope (not counted)
    missing: str  # why nothing was checked, where nothing was

    @property
    def holds(self) -> bool | None:
        """True or False where the verdict is holds or fails; None where it is neither."""
        return {HOLDS: True, FAILS: False}.get(self.verdict)

    @property
    def checked(self) -> tuple[str, ...]:
        return tuple(check.line for check in self.checks)

    @property
    def unchecked(self) -> str:
        """Why no check in scope: nothing measured at all, or only outside the scope."""
        if self.outside:
            return f"nothing measured on the paper's scope ({', '.join(self.scope.scenarios)})"
        return self.missing

    @property
    def evidence(self) -> str:
        text = "; ".join(self.checked) or self.unchecked
        if self.outside:
            text += ". Outside the paper's scope, not counted: " + "; ".join(
                check.line for check in self.outside
            )
        return text

    def as_dict(self) -> JsonObject:
        """The claim as claims.json holds it (``holds`` kept beside ``verdict`` for old readers)."""
        return {
            "statement": self.statement,
            "source": self.source,
            "scope": self.scope.as_dict(),
            "paper": self.paper,
            "ours": self.ours,
            "seeds": self.seeds,
            "verdict": self.verdict,
            "holds": self.holds,
            "checks": [check.as_dict() for check in self.checks if check.measured],
            "evidence": self.evidence,
        }


ScenarioChecks = Callable[[StudyResults, ScenarioResults], Iterator[Check]]
