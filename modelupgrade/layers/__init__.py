"""Reusable building blocks (timm-style ``layers``): pooling, margin classifiers, MLP heads."""

from modelupgrade.layers.gem import GeM
from modelupgrade.layers.margins import (
    CLASSIFIERS,
    ArcFace,
    CosFace,
    MarginClassifier,
    NormSoftmax,
    build_classifier,
)
from modelupgrade.layers.mlp import MLP, Transform

__all__ = [
    "CLASSIFIERS",
    "MLP",
    "ArcFace",
    "CosFace",
    "GeM",
    "MarginClassifier",
    "NormSoftmax",
    "Transform",
    "build_classifier",
]
