"""Promotion gates and gate evidence: pure logic, no MLflow."""

from __future__ import annotations

import pytest

from modelupgrade.config import GateParams
from modelupgrade.errors import UserError
from modelupgrade.registry.evidence import GateEvidence
from modelupgrade.registry.gates import GateInputs, evaluate_gates

PARAMS = GateParams(max_degradation_pct=5.0, max_negative_flip_rate=0.1)


def test_all_gates_pass_when_compatible_and_within_thresholds() -> None:
    report = evaluate_gates(GateInputs(0.61, 0.60, 4.9, 0.1), PARAMS)
    assert report.passed
    assert [c.name for c in report.checks] == ["compatibility", "degradation", "negative_flips"]
    tags = report.to_tags()
    assert tags["gates.passed"] == "true"
    assert tags["gate.compatibility.value"] == "0.61"
    assert tags["gate.degradation"] == "pass: Δ↓=4.90% <= 5.00%"


@pytest.mark.parametrize(
    ("inputs", "failing"),
    [
        (GateInputs(0.60, 0.60, 1.0, 0.0), "compatibility"),  # equal is not better
        (GateInputs(0.70, 0.60, 5.01, 0.0), "degradation"),
        (GateInputs(0.70, 0.60, 1.0, 0.11), "negative_flips"),
        (GateInputs(0.70, 0.60, None, 0.0), "degradation"),  # not measured fails
        (GateInputs(None, 0.60, 1.0, 0.0), "compatibility"),
    ],
)
def test_each_gate_refuses(inputs: GateInputs, failing: str) -> None:
    report = evaluate_gates(inputs, PARAMS)
    assert not report.passed
    assert [c.name for c in report.failures] == [failing]
    assert report.to_tags()[f"gate.{failing}"].startswith("fail: ")


def test_evidence_takes_the_best_path_and_decides_compatibility() -> None:
    evidence = GateEvidence.from_dict(
        {
            "metric": "map",
            "models": {"gen0": {"self": 0.5}, "gen1-dmu": {"self": 0.7, "degradation_pct": 2.0}},
            "cross": [
                {
                    "query": "gen1-dmu",
                    "gallery": "gen0",
                    "value": 0.45,
                    "via": "direct",
                    "negative_flip_rate": 0.05,
                },
                {"query": "gen1-dmu", "gallery": "gen0", "value": 0.55, "via": "dmu-forward"},
            ],
        }
    )
    inputs = evidence.gate_inputs("gen1-dmu", "gen0")
    assert inputs.cross_score == 0.55 and inputs.champion_score == 0.5
    assert inputs.degradation_pct == 2.0 and inputs.negative_flip_rate == 0.05
    assert evidence.cross[("gen1-dmu", "gen0")].via == "dmu-forward"
    assert evidence.compatible_galleries("gen1-dmu", ["gen0", "gen1-dmu"]) == ["gen0"]
    assert evidence.compatible_galleries("gen0", ["gen0", "gen1-dmu"]) == []


def test_evidence_rejects_bad_input_with_a_clear_message() -> None:
    with pytest.raises(UserError, match="unknown keys"):
        GateEvidence.from_dict({"metric": "map", "crosss": []})
    with pytest.raises(UserError, match=r"cross\[0\] needs"):
        GateEvidence.from_dict({"cross": [{"query": "a", "value": 1}]})
    with pytest.raises(UserError, match="must be a number"):
        GateEvidence.from_dict({"models": {"gen0": {"self": "high"}}})
