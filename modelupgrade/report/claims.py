"""Do the papers' claims hold here? A registry of nine claims, each as narrow as its paper.

Each claim is one ``_claim`` entry: the statement, its source (paper, table or section), its scope
(the scenario kinds the paper reports it on, the metric, the protocol or ordering), the paper's own
numbers where it gives some, and a function that checks this study's numbers on one scenario.

A claim is judged on the scenarios of its scope only: it holds where every measured check there
holds. Checks on scenarios outside its scope are shown in the evidence and not counted. No check in
scope leaves it untested, and so does a check whose numbers include a NaN (a number not measured,
never a loss). The strategies a claim is about are found by their kind in params
(``StudyResults.strategy_kinds``), the head systems of the backfill study by the scenario's heads,
the training-free adapters by their head kind (recorded in the evaluation's sources), and the
scenarios by their kind.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from modelupgrade.backfill.summary import CurveSummary
from modelupgrade.evaluation.summary import (
    BACKWARD,
    FORWARD_HEAD,
    REVERSE_ADAPTER,
    SELF,
    ComparisonRow,
)
from modelupgrade.layout import model_name
from modelupgrade.report.results import ScenarioResults, StudyResults
from modelupgrade.report.statistics import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    MIN_SEEDS,
    NOT_TESTED,
    PairedTest,
    check_verdict,
    claim_verdict,
    holm,
    joint_bootstrap_se,
)

# The strategy kinds (``strategies.<name>.kind``) the claims are about.
INDEPENDENT_KIND = "independent"
BCT_KIND = "bct"
DMU_KIND = "dmu"
# The scenario kinds (``scenarios.<name>.kind``) a claim's scope names.
EXTENDED_DATA = "extended-data"
OPEN_DATA = "open-data"
EXTENDED_CLASS = "extended-class"
OPEN_CLASS = "open-class"
IDENTICAL_DATA = "identical-data"
# Ordering policies and serving modes of the backfill study (``backfill.policies``,
# ``backfill.serving_modes``) the claims compare.
RANDOM_ORDER = "random"
OLD_CONFIDENCE_ORDER = "old-confidence"
UNCERTAINTY_ORDER = "fastfill-uncertainty"
MIXED = "mixed"
RANK_MERGE = "rank-merge"
FULL_RANK_MERGE = "rank-merge-full"
# The training-free adapter kinds (head kinds, ``adapters.heads.<name>.kind``) the claims compare:
# Drift-Adapter's three on the query side, and SLERP.
DRIFT_ADAPTER_QUERY_KINDS = ("procrustes_query", "affine_query", "residual_mlp_query")
PROCRUSTES_QUERY_KIND = "procrustes_query"
SLERP_KIND = "slerp_query"
ALL_SCENARIO_KINDS = (EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS, OPEN_CLASS, IDENTICAL_DATA)
# Drift-Adapter's lower bound on the share of full re-indexing quality an adapter recovers.
DRIFT_ADAPTER_RECOVERY = 0.95
# Drift-Adapter's upgrades are between models of comparable quality (text encoders a few percent
# apart): its claim is tested where the old model reaches this share of the new one's M. Between a
# weak old model and a strong new one, a query-side adapter searching the old gallery is capped by
# that gallery whatever it does.
COMPARABLE_PAIR = 0.9
# Why a check's draw is left out of its test.
ANCHOR_NOT_CONVERGED = "anchor model did not converge"
# The backfill curves' metrics the claims read: mAP, and top-1 (Seo et al.'s CMC, FastFill's top1).
CURVE_METRICS = ("mAP", "top1")
# A dip of a backfill curve counts only beyond this many of its query standard errors (95 %).
DIP_Z = 1.96
# Float rounding allowed on top of a stated tolerance (a dip of exactly one query's worth, computed
# as a difference of two floats, may come out a hair above it).
ROUNDING = 1e-9
# The table shows up to this many of a claim's numbers; more are summarised ("5/6 hold; e.g. …").
SHOWN = 3


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

    def as_dict(self) -> dict[str, Any]:
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

    def as_dict(self) -> dict[str, Any]:
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

    def as_dict(self) -> dict[str, Any]:
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


def check_claims(study: StudyResults, replicates: Sequence[StudyResults] = ()) -> list[Claim]:
    """Each of the papers' claims, checked on the scenarios of its scope, on the study's own seed
    and on each replicate's (``modelupgrade.replicates``)."""
    return [claim([study, *replicates]) for claim in CLAIMS]


def _claim(
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


def _model(strategy: str) -> str:
    """The evaluation's name of a strategy's new model."""
    return model_name(1, strategy)


def _curve_system(sc: ScenarioResults, system: str) -> str:
    """The model or head a backfill curve's system is: a head's by its own name, a strategy's
    plain model by the model's."""
    return system if system in sc.head_systems else _model(system)


def _old_pair(sc: ScenarioResults) -> tuple[str, str]:
    """M(old, old)'s evaluation pair."""
    return (sc.evaluation.old_model, sc.evaluation.old_model)


def _difference_se(sc: ScenarioResults, first: tuple[str, str], second: tuple[str, str]) -> float:
    """The query-bootstrap standard error of M(first) − M(second), two pairs of one evaluation."""
    return joint_bootstrap_se(
        [sc.per_query_ap(*first), sc.per_query_ap(*second)], lambda a, b: a - b
    )


def _label(strategy: str) -> str:
    return strategy.upper()


def _best_up(rows: Sequence[ComparisonRow]) -> ComparisonRow:
    """The row of the largest Δ↑ (a NaN one only when every one is NaN)."""
    return max(rows, key=lambda r: -math.inf if math.isnan(r.delta_up_pct) else r.delta_up_pct)


@_claim(
    statement="BCT's new model is backward compatible: M(φ_new^BCT, φ_old) > M(φ_old, φ_old).",
    source="BCT criterion (Shen et al.); DMU (Table 1), UniBCT (Table 4)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric="the scenario's headline metric (GLDv2 mAP@100, IJB-C TAR in the papers)",
        protocol="backfill-free: new-model queries against the old gallery",
        elsewhere=(
            "open-class: UniBCT (Table 4) finds BCT inapplicable to open-set splits (the old "
            "classifier has no row for the new classes); identical-data: BiCT (Table 5) reports "
            "BCT for softmax → ArcFace (GLDv2 22.86 vs 18.26), but this study trains only the "
            "independent model there (params/full-cpu.yaml)"
        ),
    ),
    paper=(
        "GLDv2 mAP@100, M(BCT, old) vs M(old, old): 21.12 vs 18.93 (30%→100% data), "
        "20.74 vs 18.93 (30%→70% data), 24.39 vs 17.53 (30% class→100%)"
    ),
    missing="BCT was not evaluated",
)
def bct_is_backward_compatible(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for bct in study.strategies_of_kind(BCT_KIND):
        cross = sc.value(bct, BACKWARD)
        if cross is not None and old_self is not None:
            yield Check(
                key=f"{sc.name}: M({_label(bct)}, old) vs M(old, old)",
                margin=cross - old_self,
                ours=f"{sc.name}: {cross:.4f} vs {old_self:.4f}",
                evidence=(
                    f"{sc.name}: M({_label(bct)}, old) = {cross:.4f} vs M(old, old) = "
                    f"{old_self:.4f}"
                ),
                compared=(cross, old_self),
                systems=(sc.evaluation.old_model, _model(bct)),
                query_se=_difference_se(sc, (_model(bct), sc.evaluation.old_model), _old_pair(sc)),
            )


@_claim(
    statement=(
        "BCT costs new-to-new accuracy: M(φ_new^BCT, φ_new^BCT) is below the independently "
        "trained new model's (Δ↓ > 0)."
    ),
    source="DMU (§1, Table 1)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric=(
            "the scenario's headline metric. The paper measures the loss on the landmark "
            "benchmarks (GLDv2 mAP@100 4.03/0.80/1.88 %; ROxford 2.82/−0.98/2.49 %); its own "
            "IJB-C rows give BCT Δ↓ −0.07 % and 0.11 % (Table 2): a GLDv2 finding, not a law"
        ),
        protocol="self-test of each new model; the reference is the independently trained one",
        elsewhere=(
            "open-class, identical-data: DMU reports no BCT there (its r50→r101 row also "
            "changes the data)"
        ),
    ),
    paper="GLDv2 Δ↓ of BCT: 4.03% (30%→100% data), 0.80% (30%→70% data), 1.88% (class)",
    missing="BCT or the independent model was not evaluated",
)
def bct_loses_new_to_new_accuracy(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    oracle_self = sc.evaluation.oracle_self
    for bct in study.strategies_of_kind(BCT_KIND):
        bct_self = sc.value(bct, SELF)
        if bct_self is not None and oracle_self is not None:
            label = _label(bct)
            yield Check(
                key=f"{sc.name}: M({label}, {label}) vs independent",
                margin=oracle_self - bct_self,
                ours=f"{sc.name}: {bct_self:.4f} vs {oracle_self:.4f}",
                evidence=(
                    f"{sc.name}: M({label}, {label}) = {bct_self:.4f} vs independent "
                    f"{oracle_self:.4f}"
                ),
                compared=(bct_self, oracle_self),
                # BCT's model is trained against the old one: it rests on the old model too.
                systems=(sc.evaluation.old_model, _model(bct), sc.evaluation.oracle or ""),
                query_se=_difference_se(
                    sc,
                    (sc.evaluation.oracle or "", sc.evaluation.oracle or ""),
                    (_model(bct), _model(bct)),
                ),
            )


@_claim(
    statement=(
        "DMU upgrades better than BCT on both sides: a larger new-to-old gain Δ↑ and a smaller "
        "new-to-new loss Δ↓."
    ),
    source="DMU (Table 1)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric="Δ↑ and Δ↓ (DMU Eqs. 6–7, relative %, of the headline metric)",
        protocol=(
            "DMU's Δ↑ from its best new-to-old search, backward or through its own ψ (DMU's "
            "tables fold ψ into new-to-old); BCT's from its backward search"
        ),
        elsewhere=(
            "open-class, identical-data: not in DMU's tables (its r50→r101 row also changes "
            "the data)"
        ),
    ),
    paper=(
        "GLDv2, DMU vs BCT: Δ↑ 19.18 vs 11.57%, Δ↓ 2.27 vs 4.03% (30%→100% data); "
        "Δ↑ 14.63 vs 9.56%, Δ↓ −0.42 vs 0.80% (30%→70% data)"
    ),
    missing="BCT or DMU was not evaluated",
)
def dmu_beats_bct_on_both_sides(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for bct_name in study.strategies_of_kind(BCT_KIND):
        for dmu_name in study.strategies_of_kind(DMU_KIND):
            bct, dmu = _label(bct_name), _label(dmu_name)
            bct_up = sc.row(bct_name, BACKWARD)
            dmu_ups = [r for r in sc.rows(dmu_name) if r.comparison in (BACKWARD, FORWARD_HEAD)]
            if bct_up is not None and dmu_ups:
                best = _best_up(dmu_ups)
                ours, theirs = best.delta_up_pct, bct_up.delta_up_pct
                through = " through ψ" if best.comparison == FORWARD_HEAD else ""
                yield Check(
                    key=f"{sc.name}: Δ↑ % {dmu} vs {bct}",
                    margin=ours - theirs,
                    ours=f"{sc.name}: Δ↑ {ours:.2f} vs {theirs:.2f}%",
                    evidence=f"{sc.name}: Δ↑ {dmu}{through} {ours:.2f}% vs {bct} {theirs:.2f}%",
                    compared=(ours, theirs),
                    systems=(
                        sc.evaluation.old_model,
                        _model(bct_name),
                        _model(dmu_name),
                        best.gallery_set,
                    ),
                    # Δ↑ DMU − Δ↑ BCT = 100 (M(DMU, ·) − M(BCT, old)) / M(old, old).
                    query_se=joint_bootstrap_se(
                        [
                            sc.per_query_ap(best.query_set, best.gallery_set),
                            sc.per_query_ap(bct_up.query_set, bct_up.gallery_set),
                            sc.per_query_ap(*_old_pair(sc)),
                        ],
                        lambda dmu, bct, old: 100 * (dmu - bct) / old,
                    ),
                    digits=2,
                )
            bct_self, dmu_self = sc.row(bct_name, SELF), sc.row(dmu_name, SELF)
            if bct_self is not None and dmu_self is not None:
                ours, theirs = dmu_self.delta_down_pct, bct_self.delta_down_pct
                yield Check(
                    key=f"{sc.name}: Δ↓ % {dmu} vs {bct}",
                    margin=theirs - ours,
                    ours=f"{sc.name}: Δ↓ {ours:.2f} vs {theirs:.2f}%",
                    evidence=f"{sc.name}: Δ↓ {dmu} {ours:.2f}% vs {bct} {theirs:.2f}%",
                    compared=(ours, theirs),
                    systems=(
                        sc.evaluation.old_model,
                        _model(bct_name),
                        _model(dmu_name),
                        sc.evaluation.oracle or "",
                    ),
                    # Δ↓ BCT − Δ↓ DMU = 100 (M(DMU, DMU) − M(BCT, BCT)) / M(oracle, oracle).
                    query_se=joint_bootstrap_se(
                        [
                            sc.per_query_ap(_model(dmu_name), _model(dmu_name)),
                            sc.per_query_ap(_model(bct_name), _model(bct_name)),
                            sc.per_query_ap(sc.evaluation.oracle or "", sc.evaluation.oracle or ""),
                        ],
                        lambda dmu, bct, oracle: 100 * (dmu - bct) / oracle,
                    ),
                    digits=2,
                )


@_claim(
    statement=(
        "A forward adapter ψ on the stored old vectors beats serving without it: "
        "M(new, ψ(old)) > max(M(new, old), M(old, old)), for a compatible new model (BiCT, "
        "DMU) and an independent one (FCT)."
    ),
    source="BiCT (Tables 4–5), DMU (Eq. 12), FCT (Ramanujan et al.)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, EXTENDED_CLASS, IDENTICAL_DATA),
        metric="the scenario's headline metric (GLDv2 mAP@100, ImageNet mAP in the papers)",
        protocol=(
            "new-model queries against the whole old gallery transformed by ψ, against the best "
            "system that needs no ψ; a compatible model's check is tested on the seeds where it "
            "passes BCT's criterion M(new, old) > M(old, old) (the premise of its paper's row)"
        ),
        elsewhere=(
            "open-data, open-class: no paper compares M(new, ψ(old)) with M(new, old) or "
            "M(old, old) there"
        ),
    ),
    paper=(
        "BiCT, GLDv2: 26.09 vs 23.61 (25%→100% data), 27.04 vs 25.21 (r18→r50), 26.69 vs "
        "22.86 (softmax→ArcFace); "
        "FCT, ImageNet: 44.0 vs M(old, old) 28.3 (with side-information)"
    ),
    missing="no forward head was evaluated",
)
def forward_adapters_raise_new_to_old(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for strategy in sc.evaluation.strategies:
        backward = sc.value(strategy, BACKWARD)
        if backward is None or old_self is None:
            continue
        independent = sc.evaluation.oracle == _model(strategy)
        # NaN (not measured) on either side leaves the reference not measured.
        reference = math.nan if math.isnan(backward + old_self) else max(backward, old_self)
        label = "M(old, old)" if reference == old_self else f"M({strategy}, old)"
        # FCT's ψ pairs with a model trained without the old one; BiCT's and DMU's assume a
        # compatible one.
        premise = (
            ""
            if independent or backward > old_self
            else f"premise: M({strategy}, old) {backward:.4f} ≤ M(old, old) {old_self:.4f} "
            "(not backward compatible)"
        )
        for row in sc.rows(strategy):
            if row.comparison != FORWARD_HEAD:
                continue
            yield Check(
                key=f"{sc.name}: M({row.query_set}, {row.gallery_set}) vs max(M(new, old), "
                "M(old, old))",
                margin=row.value - reference,
                ours=f"{sc.name} {row.head_set}: {row.value:.4f} vs {reference:.4f}",
                evidence=(
                    f"{sc.name}: M({row.query_set}, {row.gallery_set}) = "
                    f"{row.value:.4f} vs {label} = {reference:.4f}"
                ),
                compared=(row.value, reference),
                systems=(sc.evaluation.old_model, row.query_set, row.gallery_set),
                excluded=premise,
                query_se=_difference_se(
                    sc,
                    (row.query_set, row.gallery_set),
                    _old_pair(sc)
                    if reference == old_self
                    else (_model(strategy), sc.evaluation.old_model),
                ),
            )


@_claim(
    statement=(
        "Seo et al.'s full method (ρ and the reverse query transform ψ, trained with MCL) "
        "backfills better than the naive two-model rank merge: a larger AUC."
    ),
    source="Seo et al. (Table 1; ordering App. B.2)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS,),
        metric="AUC of mAP and of top-1 over the backfill curve (∫ by the trapezoid rule)",
        protocol=(
            "rank merge of the full method's systems (ψ(ρ(φ_new(q))) searches the old part, so a "
            "query needs no old-model pass: what RQT is for, §4.1) vs of the same old and new "
            "models (RM_naive); lowest old-classifier confidence backfilled first (old-confidence)"
        ),
        elsewhere=(
            "Seo et al. compare the full method with the naive merge on extended-class upgrades "
            "only (Tables 1 and A2; open-class, Fig. 9, against RACT)"
        ),
    ),
    paper=(
        "AUC mAP 53.4 vs 40.0 (ImageNet), 41.4 vs 30.8 (CIFAR-100); "
        "AUC top-1 68.1 vs 63.9 (ImageNet)"
    ),
    missing="no full rank-merge system (rm_full head) was simulated",
)
def full_method_beats_naive_rank_merge(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (OLD_CONFIDENCE_ORDER, FULL_RANK_MERGE):
            continue
        naive = sc.curve(_paired_strategy(sc, curve.strategy), OLD_CONFIDENCE_ORDER, RANK_MERGE)
        if naive is not None:
            yield from _larger_auc(sc, curve, naive, "auc_trapezoid", "AUC", "naive rank merge")


@_claim(
    statement=(
        "Distance rank merge of the independently trained old and new models (RM_naive) rises "
        "monotonically as the gallery is backfilled: no dip beyond one query's worth."
    ),
    source="Seo et al. (§3.1 Eq. 8, §3.2; Figs. 2 and 9)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS, OPEN_CLASS),
        metric=(
            "mAP and top-1 at each point of the curve; a dip counts only beyond 1.96 standard "
            "errors of the test queries' changes there (what another draw of queries would move "
            "it by)"
        ),
        protocol=(
            "rank merge (RM_naive) of the independent new model; old-confidence order (Seo et "
            "al.'s protocol) and random order (App. A)"
        ),
        elsewhere=(
            "Seo et al. test class-split upgrades only (extended-class, Figs. 2 and 6; "
            "open-class, Fig. 9)"
        ),
    ),
    paper=None,
    missing="no rank-merge curve of the independent model was simulated",
)
def rank_merge_is_monotone(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    if sc.backfill is None:
        return
    # Without per-query noise (a summary written before it was kept): one query's worth, the most
    # one query more or less answered right moves mAP or top-1.
    one_query = 1.0 / max(sc.backfill.queries, 1)
    independent = study.strategies_of_kind(INDEPENDENT_KIND)
    for curve in sc.backfill_curves():
        if (
            curve.mode != RANK_MERGE
            or curve.strategy not in independent
            or curve.policy not in (OLD_CONFIDENCE_ORDER, RANDOM_ORDER)
            or not curve.deployable
        ):
            continue
        for metric in CURVE_METRICS:
            if metric not in curve.conditions:
                continue
            # A NaN point of the curve makes the largest drop NaN: not measured.
            conditions = curve.conditions[metric]
            drop, se = conditions.largest_drop, conditions.largest_drop_se
            # A dip counts only beyond what drawing other test queries would move it by.
            noisy = math.isfinite(se)
            tolerance = DIP_Z * se if noisy else one_query
            name = f"{sc.name} {curve.strategy}/{curve.policy} {metric}"
            why = f"{DIP_Z} × its query standard error" if noisy else "one query's worth"
            yield Check(
                key=f"{name} largest dip",
                margin=tolerance + ROUNDING - drop,
                ours=f"{name} dip {drop:.4f}",
                evidence=f"{name}: largest dip {drop:.4f} (tolerance {tolerance:.4f}, {why})",
                compared=(drop,),
                systems=(sc.evaluation.old_model, _model(curve.strategy)),
                query_se=se,
                curves=(CurveRef(sc.name, curve.strategy, curve.policy, curve.mode, metric),),
            )


@_claim(
    statement=(
        "FastFill's σ² order (highest uncertainty first) backfills better than a random order "
        "for the same adapter: a larger backfilling-averaged metric."
    ),
    source="FastFill (Table 5, ImageNet ablation)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS,),
        metric="M̃ of mAP and of top-1: the mean over the curve's points (FastFill Eq. 6)",
        protocol=(
            "one search space: new-model queries against the mixed gallery (ψ(old), new); the "
            "random order's curve is the mean of backfill.random_permutations orders (FastFill "
            "averages 5)"
        ),
        elsewhere=(
            "FastFill compares the two orders on class-split upgrades only (ImageNet-500→1000)"
        ),
    ),
    paper="mAP~ 44.84 vs 42.05, top1~ 66.49 vs 64.51 (ImageNet)",
    missing="no FastFill adapter was simulated",
)
def uncertainty_order_beats_random(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (UNCERTAINTY_ORDER, MIXED):
            continue
        random_order = sc.curve(curve.strategy, RANDOM_ORDER, MIXED)
        if random_order is not None:
            yield from _larger_auc(
                sc,
                curve,
                random_order,
                "auc_mean",
                "mean",
                "random"
                + (
                    f" (the mean of {random_order.permutations} orders)"
                    if random_order.permutations > 1
                    else ""
                ),
                ours_name="σ² order ",
            )


class FittedAdapter(NamedTuple):
    """A query-side adapter's row of the evaluation, with its kind and sample size."""

    strategy: str
    name: str
    kind: str
    sample_size: int
    row: ComparisonRow


def _query_adapters(sc: ScenarioResults, kinds: Sequence[str]) -> list[FittedAdapter]:
    """The scenario's query-side adapters of ``kinds`` fitted on the largest sample of each
    strategy (the evaluation's sources record each fit's kind and sample size)."""
    found = []
    for strategy in sc.evaluation.strategies:
        for row in sc.rows(strategy):
            if row.comparison != REVERSE_ADAPTER or row.head_set is None:
                continue
            name = row.head_set.split("(")[0]
            info = sc.evaluation.sources.get(name, {})
            if info.get("kind") in kinds and info.get("sample_size") is not None:
                found.append(
                    FittedAdapter(strategy, name, info["kind"], int(info["sample_size"]), row)
                )
    largest = {
        s: max(a.sample_size for a in found if a.strategy == s) for s in {a.strategy for a in found}
    }
    return [a for a in found if a.sample_size == largest[a.strategy]]


@_claim(
    statement=(
        "A training-free query-side adapter (orthogonal Procrustes, low-rank affine or residual "
        "MLP), fitted on a sample of paired old/new embeddings, recovers 95–99 % of full "
        "re-indexing: M(adapter(φ_new), φ_old) ≥ 0.95 · M(φ_new, φ_new)."
    ),
    source="Drift-Adapter (Vejendla, EMNLP 2025, arXiv 2509.23471; abstract)",
    scope=Scope(
        scenarios=ALL_SCENARIO_KINDS,
        metric="the scenario's headline metric (Recall@10 and MRR in the paper)",
        protocol=(
            "new-model queries mapped into the old space by the best of the three adapters "
            "fitted on the largest sample, against the untouched old gallery; the reference is "
            "the same new model against its fully re-embedded gallery. The paper's: text "
            "embeddings (MTEB corpora) and a CLIP image-model upgrade with 1M items, its own "
            "model pairs and sample sizes"
        ),
        elsewhere=(
            "none: every scenario kind here is an upgrade between two independently trained "
            "models, the paper's setting; only the scenarios under adapters.scenarios have "
            "adapters"
        ),
    ),
    paper="95–99 % of full re-embedding Recall@10 / MRR, < 10 µs added query latency",
    missing="no query-side Drift-Adapter kind was fitted (adapters.scenarios, adapters.heads)",
)
def drift_adapter_recovers_reindexing(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    adapters = _query_adapters(sc, DRIFT_ADAPTER_QUERY_KINDS)
    for strategy in dict.fromkeys(a.strategy for a in adapters):
        fits = [a for a in adapters if a.strategy == strategy]
        own = sc.value(strategy, SELF)
        if own is None:
            continue
        best = max(fits, key=lambda a: a.row.value)
        share = best.row.value / own if own else math.nan
        old_self = sc.evaluation.old_self
        gap = own - old_self
        closed = (best.row.value - old_self) / gap if gap > 0 else math.nan
        each = ", ".join(
            f"{a.kind} {100 * a.row.value / own:.1f} %" if own else f"{a.kind} –" for a in fits
        )
        premise = (
            "premise not measured: M(old, old) is missing"
            if math.isnan(old_self)
            else ""
            if old_self >= COMPARABLE_PAIR * own
            else f"premise: the old model reaches {100 * old_self / own:.1f} % of the new one's M "
            f"(Drift-Adapter's upgrades: models of comparable quality, here ≥ "
            f"{100 * COMPARABLE_PAIR:.0f} %)"
        )
        # The share of the old→new gap closed, beside the share of M(new, new): none where the
        # old model is as good as the new one (no gap to close).
        has_gap = math.isfinite(closed)
        gap_text = f"; {100 * closed:.1f} % of the old→new gap" if has_gap else ""
        closed_text = (
            f", {100 * closed:.1f} % of the gap from M(old, old) = {old_self:.4f} closed"
            if has_gap
            else f", no gap from M(old, old) = {old_self:.4f} to close"
        )
        yield Check(
            key=f"{sc.name}: best query-side adapter, % of M({strategy}, {strategy})",
            margin=100 * (share - DRIFT_ADAPTER_RECOVERY),
            ours=(
                f"{sc.name}: {100 * share:.1f} % ({best.kind}, {best.sample_size} pairs{gap_text})"
            ),
            evidence=(
                f"{sc.name}: best query-side adapter {best.name} M = {best.row.value:.4f} vs "
                f"M({strategy}, {strategy}) = {own:.4f}: {100 * share:.1f} % on "
                f"{best.sample_size} pairs{closed_text} (each kind: {each})"
            ),
            compared=(100 * share, 100 * closed) if has_gap else (100 * share,),
            systems=(sc.evaluation.old_model, _model(strategy), best.name),
            digits=1,
            excluded=premise,
            query_se=joint_bootstrap_se(
                [
                    sc.per_query_ap(best.row.query_set, best.row.gallery_set),
                    sc.per_query_ap(_model(strategy), _model(strategy)),
                ],
                lambda adapted, own: 100 * adapted / own,
            ),
        )


@_claim(
    statement=(
        "Blending the Procrustes-aligned new query with the old model's query along the sphere "
        "(SLERP) is backward compatible, M(SLERP, old) > M(old, old), and beats the Procrustes "
        "alignment alone, M(SLERP, old) > M(Procrustes, old)."
    ),
    source=(
        "SLERP backward compatibility (Ricci, Biondi, Pernici, NeurIPS 2026; "
        "miccunifi/SLERP_backward_compatibility README)"
    ),
    scope=Scope(
        scenarios=ALL_SCENARIO_KINDS,
        metric="the scenario's headline metric (R@1 of image-text retrieval in the paper)",
        protocol=(
            "the query embedded by both models, the aligned new query blended with the old one "
            "by α chosen on a held-out support fifth of the fitting pairs (as the paper picks α "
            "on a support set), against the old gallery; fitted on the largest sample. The "
            "paper's: CLIP and SigLIP pairs on Flickr30k, COCO and NoCaps"
        ),
        elsewhere=(
            "none: every scenario kind here is an upgrade between two independently trained "
            "models; only the scenarios under adapters.scenarios have adapters"
        ),
    ),
    paper=(
        "backward compatibility in 85/90 settings vs 45/90 for Procrustes alone; Flickr30k "
        "I2T R@1 CLIP L/14→B/32: old 40.62, Procrustes 42.89, SLERP 48.00 (new/new 48.73)"
    ),
    missing="no SLERP query adapter was fitted (adapters.scenarios, adapters.heads)",
)
def slerp_is_backward_compatible(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    adapters = _query_adapters(sc, (SLERP_KIND, PROCRUSTES_QUERY_KIND))
    for slerp in (a for a in adapters if a.kind == SLERP_KIND):
        value = slerp.row.value
        yield Check(
            key=f"{sc.name}: M({slerp.name}, old) vs M(old, old)",
            margin=value - old_self,
            ours=f"{sc.name}: {value:.4f} vs old {old_self:.4f}",
            evidence=(
                f"{sc.name}: M({slerp.name}, old) = {value:.4f} vs M(old, old) = {old_self:.4f}"
            ),
            compared=(value, old_self),
            systems=(sc.evaluation.old_model, _model(slerp.strategy), slerp.name),
            query_se=_difference_se(
                sc, (slerp.row.query_set, slerp.row.gallery_set), _old_pair(sc)
            ),
        )
        for procrustes in adapters:
            if procrustes.kind != PROCRUSTES_QUERY_KIND or procrustes.strategy != slerp.strategy:
                continue
            other = procrustes.row.value
            yield Check(
                key=f"{sc.name}: M({slerp.name}, old) vs M({procrustes.name}, old)",
                margin=value - other,
                ours=f"{sc.name}: {value:.4f} vs Procrustes {other:.4f}",
                evidence=(
                    f"{sc.name}: M({slerp.name}, old) = {value:.4f} vs "
                    f"M({procrustes.name}, old) = {other:.4f} ({slerp.sample_size} pairs)"
                ),
                compared=(value, other),
                systems=(
                    sc.evaluation.old_model,
                    _model(slerp.strategy),
                    slerp.name,
                    procrustes.name,
                ),
                query_se=_difference_se(
                    sc,
                    (slerp.row.query_set, slerp.row.gallery_set),
                    (procrustes.row.query_set, procrustes.row.gallery_set),
                ),
            )


def _paired_strategy(sc: ScenarioResults, system: str) -> str:
    """The strategy whose plain rank merge a head's system is compared with (itself if none)."""
    return sc.head_systems.get(system, system)


CLAIMS: tuple[Callable[[Sequence[StudyResults]], Claim], ...] = (
    bct_is_backward_compatible,
    bct_loses_new_to_new_accuracy,
    dmu_beats_bct_on_both_sides,
    forward_adapters_raise_new_to_old,
    full_method_beats_naive_rank_merge,
    rank_merge_is_monotone,
    uncertainty_order_beats_random,
    drift_adapter_recovers_reindexing,
    slerp_is_backward_compatible,
)


def _larger_auc(
    sc: ScenarioResults,
    curve: CurveSummary,
    other: CurveSummary,
    kind: str,
    measure: str,
    other_name: str,
    ours_name: str = "",
) -> Iterator[Check]:
    """One check per curve metric: ``curve``'s AUC of ``kind`` above ``other``'s."""
    ours_aucs, their_aucs = curve.auc(kind), other.auc(kind)
    for metric in CURVE_METRICS:
        if metric not in ours_aucs or metric not in their_aucs:
            continue
        ours, theirs = ours_aucs[metric], their_aucs[metric]
        yield Check(
            key=f"{sc.name} {curve.strategy}: {measure} {metric} {ours_name}vs {other_name}",
            margin=ours - theirs,
            ours=f"{sc.name}: {metric} {ours:.4f} vs {theirs:.4f}",
            evidence=(
                f"{sc.name} {curve.strategy}: {measure} {metric} {ours_name}{ours:.4f} "
                f"vs {other_name} {theirs:.4f}"
            ),
            compared=(ours, theirs),
            systems=(
                sc.evaluation.old_model,
                *(_curve_system(sc, c.strategy) for c in (curve, other)),
            ),
            query_se=joint_bootstrap_se(
                [
                    sc.per_query_auc(c.strategy, c.policy, c.mode, metric, kind)
                    for c in (curve, other)
                ],
                lambda a, b: a - b,
            ),
            curves=tuple(
                CurveRef(sc.name, c.strategy, c.policy, c.mode, metric) for c in (curve, other)
            ),
        )
