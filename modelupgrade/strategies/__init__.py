"""Compatibility strategies: one class each, registered by kind in ``STRATEGIES``."""

from modelupgrade.strategies import (
    bct,
    contrastive,
    dmu,
    focal,
    independent,
    lce,
    regression,
    unibct,
)
from modelupgrade.strategies.base import (
    STRATEGIES,
    CompatibilityStrategy,
    OldClassifierStrategy,
    StepInputs,
    StrategyOptions,
    TrainingContext,
    WeightedOptions,
    build_strategy,
    class_means,
    old_class_prototypes,
)
from modelupgrade.strategies.bct import BCT
from modelupgrade.strategies.contrastive import RACT, Contrastive, compatibility_info_nce
from modelupgrade.strategies.dmu import DMU, FORWARD_HEAD_FILE, selective_weights
from modelupgrade.strategies.focal import FocalDistillation
from modelupgrade.strategies.independent import Independent
from modelupgrade.strategies.lce import LCE
from modelupgrade.strategies.regression import Regression
from modelupgrade.strategies.unibct import UniBCT, propagation_weights, refined_prototypes

__all__ = [
    "BCT",
    "DMU",
    "FORWARD_HEAD_FILE",
    "LCE",
    "RACT",
    "STRATEGIES",
    "CompatibilityStrategy",
    "Contrastive",
    "FocalDistillation",
    "Independent",
    "OldClassifierStrategy",
    "Regression",
    "StepInputs",
    "StrategyOptions",
    "TrainingContext",
    "UniBCT",
    "WeightedOptions",
    "bct",
    "build_strategy",
    "class_means",
    "compatibility_info_nce",
    "contrastive",
    "dmu",
    "focal",
    "independent",
    "lce",
    "old_class_prototypes",
    "propagation_weights",
    "refined_prototypes",
    "regression",
    "selective_weights",
    "unibct",
]
