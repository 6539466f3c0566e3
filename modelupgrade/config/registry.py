"""params.yaml: ``registry`` section (MLflow tracking, model registry, promotion gates)."""

from __future__ import annotations

from pydantic import Field

from modelupgrade.config.base import Section


class GateParams(Section):
    max_degradation_pct: float = Field(default=5.0)
    max_negative_flip_rate: float = Field(default=0.2, ge=0, le=1)


class RegistryParams(Section):
    tracking_uri: str = "sqlite:///mlflow.db"
    artifact_root: str = "mlartifacts"
    experiment: str = "modelupgrade"
    model_name: str = "fashion-retrieval"
    gates: GateParams = Field(default_factory=GateParams)
