"""Transformation heads: forward adapters for the stored gallery, reverse transforms for the query.

One base class (``Head``), one file per method, one registry (``HEADS``); a kind is declared by its
class statement (``class FCTAdapter(Head[FCTOptions], kind="fct", direction="forward")``). Importing
this package registers every head kind: the trained heads (FCT, FastFill, BiCT, DMU, RQT, MCL,
RM full method) and the training-free adapters (Procrustes, low-rank affine, residual MLP and
their local, per-cluster forms, each in both directions; SLERP and query drift compensation on the
query side; ``modelupgrade.heads.alignment``).
"""

from modelupgrade.config.heads import HeadTraining
from modelupgrade.heads.base import (
    HEADS,
    EmbeddingPairs,
    Head,
    HeadBatch,
    build_head,
    head_dims,
)
from modelupgrade.heads.bict import BiCTUpgradeModule
from modelupgrade.heads.chain import HeadChain, load_chain, momentum_input
from modelupgrade.heads.dmu import DMUForwardAdapter
from modelupgrade.heads.evaluation_outputs import write_head_outputs
from modelupgrade.heads.fastfill import FastFillAdapter
from modelupgrade.heads.fct import FCTAdapter
from modelupgrade.heads.inference import (
    FoldedMLP,
    FrozenHead,
    apply,
    apply_with_uncertainty,
    inference_copy,
)
from modelupgrade.heads.local import (
    LocalAffineAdapter,
    LocalAffineQueryAdapter,
    LocalProcrustesAdapter,
    LocalProcrustesQueryAdapter,
)
from modelupgrade.heads.low_rank_affine import LowRankAffineAdapter, LowRankAffineQueryAdapter
from modelupgrade.heads.mcl import MCLReverseTransform
from modelupgrade.heads.persistence import head_card, load_head, read_head_card, save_head
from modelupgrade.heads.procrustes import ProcrustesAdapter, ProcrustesQueryAdapter
from modelupgrade.heads.qdc import QueryDriftCompensation
from modelupgrade.heads.residual_mlp import ResidualMLPAdapter, ResidualMLPQueryAdapter
from modelupgrade.heads.rm_full import RankMergeFullMethod
from modelupgrade.heads.rqt import ReverseQueryTransform
from modelupgrade.heads.slerp import SlerpQueryAdapter
from modelupgrade.heads.training import TrainingResult, fit_head, resolve_training

__all__ = [
    "HEADS",
    "BiCTUpgradeModule",
    "DMUForwardAdapter",
    "EmbeddingPairs",
    "FCTAdapter",
    "FastFillAdapter",
    "FoldedMLP",
    "FrozenHead",
    "Head",
    "HeadBatch",
    "HeadChain",
    "HeadTraining",
    "LocalAffineAdapter",
    "LocalAffineQueryAdapter",
    "LocalProcrustesAdapter",
    "LocalProcrustesQueryAdapter",
    "LowRankAffineAdapter",
    "LowRankAffineQueryAdapter",
    "MCLReverseTransform",
    "ProcrustesAdapter",
    "ProcrustesQueryAdapter",
    "QueryDriftCompensation",
    "RankMergeFullMethod",
    "ResidualMLPAdapter",
    "ResidualMLPQueryAdapter",
    "ReverseQueryTransform",
    "SlerpQueryAdapter",
    "TrainingResult",
    "apply",
    "apply_with_uncertainty",
    "build_head",
    "fit_head",
    "head_card",
    "head_dims",
    "inference_copy",
    "load_chain",
    "load_head",
    "momentum_input",
    "read_head_card",
    "resolve_training",
    "save_head",
    "write_head_outputs",
]
