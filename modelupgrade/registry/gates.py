"""Promotion gates: what a new generation must show before it may become ``candidate``.

Each gate is one class registered in ``GATES``; ``evaluate_gates`` applies all of them. A gate whose
metric was not measured fails, saying so: an unverified model is not promoted silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from modelupgrade.config import GateParams
from modelupgrade.plugins import Registry


@dataclass(frozen=True)
class GateInputs:
    """Measured numbers about one new model relative to the current champion.

    ``cross_score`` is M(new query, champion gallery) — directly or through an adapter, whichever
    serves the stored gallery best — and ``champion_score`` is M(champion, champion).
    ``degradation_pct`` is Δ↓ against the independently trained model; ``negative_flip_rate`` the
    share of queries right at top-1 under the champion and wrong under the new model.
    """

    cross_score: float | None = None
    champion_score: float | None = None
    degradation_pct: float | None = None
    negative_flip_rate: float | None = None
    metric: str = "map"


@dataclass(frozen=True)
class GateCheck:
    name: str
    passed: bool
    value: float | None
    threshold: float | None
    detail: str


@dataclass(frozen=True)
class GateReport:
    checks: list[GateCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    def summary(self) -> str:
        return "; ".join(
            f"{c.name}: {'pass' if c.passed else 'FAIL'} ({c.detail})" for c in self.checks
        )

    def to_tags(self) -> dict[str, str]:
        """Model-version tags: the overall verdict, and per gate its verdict with the comparison
        (``gate.<name>``, read by people in the UI and back by ``read_gate_verdicts``) and its
        measured value (``gate.<name>.value``)."""
        tags = {"gates.passed": str(self.passed).lower()}
        for c in self.checks:
            verdict = GateVerdict(c.name, PASS if c.passed else FAIL, c.detail)
            tags[GATE_TAG + c.name] = verdict.tag_value()
            tags[f"{GATE_TAG}{c.name}.value"] = "n/a" if c.value is None else f"{c.value:.6g}"
        return tags


# A gate's verdict on a model version: the tag ``gate.<name>`` holds "<verdict>: <detail>".
GATE_TAG = "gate."
PASS, FAIL = "pass", "fail"


@dataclass(frozen=True)
class GateVerdict:
    """One gate's verdict as a model version's tags record it (``GateReport.to_tags``)."""

    gate: str
    verdict: str  # PASS or FAIL
    detail: str

    @property
    def failed(self) -> bool:
        return self.verdict.startswith(FAIL)

    def tag_value(self) -> str:
        return f"{self.verdict}: {self.detail}"

    def as_row(self) -> dict[str, str]:
        return {"gate": self.gate, "verdict": self.verdict, "detail": self.detail}


def read_gate_verdicts(tags: Mapping[str, str]) -> list[GateVerdict]:
    """The gate verdicts among a model version's ``tags``, by gate name."""
    verdicts = []
    for name, value in sorted(tags.items()):
        if not name.startswith(GATE_TAG) or name.count(".") != 1:
            continue  # gate.<name>.value, or another tag
        verdict, colon, detail = value.partition(":")
        verdicts.append(
            GateVerdict(name[len(GATE_TAG) :], verdict, (detail if colon else value).strip())
        )
    return verdicts


def failed_gates(tags: Mapping[str, str]) -> list[str]:
    """The names of the gates a model version failed, sorted."""
    return [v.gate for v in read_gate_verdicts(tags) if v.failed]


class Gate(ABC):
    registry_name: ClassVar[str]

    @property
    def name(self) -> str:
        """The name the gate is registered under (its ``gate.<name>`` tags)."""
        return self.registry_name

    @abstractmethod
    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck: ...


GATES: Registry[Gate] = Registry("promotion gate")


def _missing(name: str, what: str) -> GateCheck:
    return GateCheck(name, False, None, None, f"{what} was not measured")


@GATES.register("compatibility")
class CompatibilityGate(Gate):
    """The new model's queries must search the champion's gallery better than the champion does."""

    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck:
        if inputs.cross_score is None or inputs.champion_score is None:
            return _missing(
                self.name, f"M(new, champion) or M(champion, champion) [{inputs.metric}]"
            )
        passed = inputs.cross_score > inputs.champion_score
        return GateCheck(
            self.name,
            passed,
            inputs.cross_score,
            inputs.champion_score,
            f"M(new, champion)={inputs.cross_score:.4f} "
            f"{'>' if passed else '<='} M(champion, champion)={inputs.champion_score:.4f} "
            f"[{inputs.metric}]",
        )


class UpperBoundGate(Gate):
    """A measured number of the new generation that must not exceed a limit
    of ``registry.gates``."""

    measured: ClassVar[str]  # the GateInputs field
    limit: ClassVar[str]  # the GateParams field
    missing: ClassVar[str]  # what is unmeasured when the field is None
    # The check's detail, from {value}, {limit} and {relation} (<= when it passes, > when not).
    shown: ClassVar[str]

    def describe(self, value: float, passed: bool, limit: float) -> str:
        return self.shown.format(value=value, limit=limit, relation="<=" if passed else ">")

    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck:
        value = getattr(inputs, self.measured)
        if value is None:
            return _missing(self.name, self.missing)
        limit = getattr(params, self.limit)
        passed = value <= limit
        return GateCheck(self.name, passed, value, limit, self.describe(value, passed, limit))


@GATES.register("degradation")
class DegradationGate(UpperBoundGate):
    """Δ↓: compatibility may cost new-to-new accuracy only up to a bound."""

    measured, limit = "degradation_pct", "max_degradation_pct"
    missing = "Δ↓ (degradation against the independent model)"
    shown = "Δ↓={value:.2f}% {relation} {limit:.2f}%"


@GATES.register("negative_flips")
class NegativeFlipGate(UpperBoundGate):
    """Queries the champion answered right must rarely be answered wrong after the upgrade."""

    measured, limit = "negative_flip_rate", "max_negative_flip_rate"
    missing = "the negative-flip rate against the champion"
    shown = "negative flips {value:.4f} {relation} {limit:.4f}"


def evaluate_gates(inputs: GateInputs, params: GateParams) -> GateReport:
    return GateReport([GATES.get(name)().check(inputs, params) for name in GATES.names()])
