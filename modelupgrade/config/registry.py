"""params.yaml: ``registry`` section (MLflow tracking, model registry, promotion gates)."""

from __future__ import annotations

from pydantic import Field

from modelupgrade.config.base import Section


class GateParams(Section):
    """Thresholds a new generation must meet before it may become ``candidate``.

    The compatibility gate itself, M(new query, champion gallery) > M(champion, champion), has no
    threshold: it is the empirical compatibility criterion of the BCT paper.
    """

    # Δ↓ of the DMU paper, relative percent against the independently trained (oracle) model.
    max_degradation_pct: float = Field(default=5.0)
    # Share of queries right at top-1 under the champion and wrong under the new model.
    max_negative_flip_rate: float = Field(default=0.2, ge=0, le=1)


class RegistryParams(Section):
    # ``MLFLOW_TRACKING_URI`` in the environment overrides this (a team server, for example).
    tracking_uri: str = "sqlite:///mlflow.db"
    # Local directory for run and model artifacts when the tracking URI is a local database.
    artifact_root: str = "mlartifacts"
    experiment: str = "modelupgrade"
    # Registered models are named ``<model_name>-<scenario>``: one retrieval system per scenario.
    model_name: str = "fashion-retrieval"
    # Retrieval metric the gates compare (a metric of the cross-model table, e.g. mAP or top1);
    # None = evaluation.headline_metric.
    gate_metric: str | None = None
    gates: GateParams = Field(default_factory=GateParams)
    # Seconds a writer waits for the store's file lock before giving up.
    lock_timeout_s: float = Field(default=600.0, gt=0)
