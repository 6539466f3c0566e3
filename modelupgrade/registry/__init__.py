"""MLflow tracking, the model registry with lineage, and promotion behind compatibility gates.

Stages log through one interface, ``StageLog``: ``track_stage`` (a record written when the stage
ends, spooled when MLflow is not loaded) or ``Tracker.stage_run`` (a live run). Generations are
registered with ``ModelRegistry`` and promoted with ``promote``. The MLflow import is deferred to
first use (it is slow).
"""

from modelupgrade.registry.evidence import CrossScore, GateEvidence
from modelupgrade.registry.execution import PARENT_RUN_ENV
from modelupgrade.registry.gates import GATES, GateCheck, GateInputs, GateReport, evaluate_gates
from modelupgrade.registry.lineage import format_lineage, lineage_rows
from modelupgrade.registry.promotion import PromotionResult, gate_version, promote
from modelupgrade.registry.provenance import current_user, data_hash_of, dvc_data_hash, git_commit
from modelupgrade.registry.stage_log import StageLog, StageRecord
from modelupgrade.registry.stage_tracking import track_stage
from modelupgrade.registry.study import (
    GenerationSource,
    RegistrationOutcome,
    RegistrationSummary,
    register_generations,
)
from modelupgrade.registry.tracker import StageRun, Tracker, stage_wall_times
from modelupgrade.registry.tracking_config import TrackingConfig
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
    "RegistrationSummary",
    "StageLog",
    "StageRecord",
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
    "stage_wall_times",
    "track_stage",
]
