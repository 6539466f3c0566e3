"""MLflow tracking, the model registry with lineage, and promotion behind compatibility gates.

Stages log through ``Tracker.stage_run``; generations are registered with ``ModelRegistry`` and
promoted with ``promote``. The MLflow import is deferred to first use (it is slow).
"""

from modelupgrade.registry.evidence import CrossScore, GateEvidence
from modelupgrade.registry.gates import GATES, GateCheck, GateInputs, GateReport, evaluate_gates
from modelupgrade.registry.lineage import format_lineage, lineage_rows
from modelupgrade.registry.promotion import PromotionResult, gate_version, promote
from modelupgrade.registry.study import GenerationSource, RegistrationOutcome, register_generations
from modelupgrade.registry.tracking import (
    PARENT_RUN_ENV,
    StageRun,
    Tracker,
    TrackingConfig,
    current_user,
    data_hash_of,
    dvc_data_hash,
    git_commit,
)
from modelupgrade.registry.versions import (
    CANDIDATE,
    CHAMPION,
    GenerationRecord,
    ModelRegistry,
    VersionInfo,
    registered_model_name,
)

__all__ = [
    "CANDIDATE",
    "CHAMPION",
    "GATES",
    "PARENT_RUN_ENV",
    "CrossScore",
    "GateCheck",
    "GateEvidence",
    "GateInputs",
    "GateReport",
    "GenerationRecord",
    "GenerationSource",
    "ModelRegistry",
    "PromotionResult",
    "RegistrationOutcome",
    "StageRun",
    "Tracker",
    "TrackingConfig",
    "VersionInfo",
    "current_user",
    "data_hash_of",
    "dvc_data_hash",
    "evaluate_gates",
    "format_lineage",
    "gate_version",
    "git_commit",
    "lineage_rows",
    "promote",
    "register_generations",
    "registered_model_name",
]
