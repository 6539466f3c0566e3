"""Promotion gates: what a new generation must show before it may become ``candidate``.

Each gate is one class registered in ``GATES``; ``evaluate_gates`` applies all of them. A gate whose
metric was not measured fails, saying so: an unverified model is not promoted silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from modelupgrade.config import GateParams
from modelupgrade.registry_util import Registry


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
        return "; ".join(f"{c.name}: {'pass' if c.passed else 'FAIL'} ({c.detail})" for c in self.checks)

    def to_tags(self) -> dict[str, str]:
        """Model-version tags: the overall verdict, and per gate its verdict with the comparison
        (``gate.<name>``, read by people in the UI) and its measured value (``gate.<name>.value``)."""
        tags = {"gates.passed": str(self.passed).lower()}
        for c in self.checks:
            tags[f"gate.{c.name}"] = f"{'pass' if c.passed else 'fail'}: {c.detail}"
            tags[f"gate.{c.name}.value"] = "n/a" if c.value is None else f"{c.value:.6g}"
        return tags


class Gate(ABC):
    name: str

    @abstractmethod
    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck: ...


GATES: Registry[Gate] = Registry("promotion gate")


def _missing(name: str, what: str) -> GateCheck:
    return GateCheck(name, False, None, None, f"{what} was not measured")


@GATES.register("compatibility")
class CompatibilityGate(Gate):
    """The new model's queries must search the champion's gallery better than the champion does."""

    name = "compatibility"

    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck:
        if inputs.cross_score is None or inputs.champion_score is None:
            return _missing(self.name, f"M(new, champion) or M(champion, champion) [{inputs.metric}]")
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


@GATES.register("degradation")
class DegradationGate(Gate):
    """Δ↓: compatibility may cost new-to-new accuracy only up to a bound."""

    name = "degradation"

    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck:
        if inputs.degradation_pct is None:
            return _missing(self.name, "Δ↓ (degradation against the independent model)")
        limit = params.max_degradation_pct
        passed = inputs.degradation_pct <= limit
        return GateCheck(
            self.name, passed, inputs.degradation_pct, limit,
            f"Δ↓={inputs.degradation_pct:.2f}% {'<=' if passed else '>'} {limit:.2f}%",
        )


@GATES.register("negative_flips")
class NegativeFlipGate(Gate):
    """Queries the champion answered right must rarely be answered wrong after the upgrade."""

    name = "negative_flips"

    def check(self, inputs: GateInputs, params: GateParams) -> GateCheck:
        if inputs.negative_flip_rate is None:
            return _missing(self.name, "the negative-flip rate against the champion")
        limit = params.max_negative_flip_rate
        passed = inputs.negative_flip_rate <= limit
        return GateCheck(
            self.name, passed, inputs.negative_flip_rate, limit,
            f"negative flips {inputs.negative_flip_rate:.4f} {'<=' if passed else '>'} {limit:.4f}",
        )


def evaluate_gates(inputs: GateInputs, params: GateParams) -> GateReport:
    return GateReport([GATES.get(name)().check(inputs, params) for name in GATES.names()])
