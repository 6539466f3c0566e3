"""Cross-model retrieval evaluation: the matrix M(φ_q, φ_g), heatmaps, Δ↑ / Δ↓ / negative flips;
Revisited Oxford/Paris queries scored per set under Easy/Medium/Hard (``revisited``)."""

from modelupgrade.evaluation.cross_model import (
    MATRIX_COLUMNS,
    NFR_METRIC,
    CrossModelResult,
    StrategyComparisons,
    all_compatible_pairs,
    compatibility_matrix,
    cross_model_matrix,
    delta_down,
    essential_pairs,
    self_scores,
    sequential_summary,
    strategy_summary,
    write_heatmap,
)
from modelupgrade.evaluation.retrieval import PairResult, RetrievalEvaluator
from modelupgrade.evaluation.revisited import EvaluationGroundTruth, RevisitedSet
from modelupgrade.evaluation.summary import (
    ChainEvaluation,
    ComparisonRow,
    Compatibility,
    ScenarioEvaluation,
    SequentialEvaluation,
    read_evaluation,
)
from modelupgrade.retrieval.protocol import resolve_protocol

__all__ = [
    "MATRIX_COLUMNS",
    "NFR_METRIC",
    "ChainEvaluation",
    "ComparisonRow",
    "Compatibility",
    "CrossModelResult",
    "EvaluationGroundTruth",
    "PairResult",
    "RetrievalEvaluator",
    "RevisitedSet",
    "ScenarioEvaluation",
    "SequentialEvaluation",
    "StrategyComparisons",
    "all_compatible_pairs",
    "compatibility_matrix",
    "cross_model_matrix",
    "delta_down",
    "essential_pairs",
    "read_evaluation",
    "resolve_protocol",
    "self_scores",
    "sequential_summary",
    "strategy_summary",
    "write_heatmap",
]
