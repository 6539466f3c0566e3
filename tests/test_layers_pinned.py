"""The margin heads and GeM pinned on hand-computed values: a wrong formula fails these, not only a
wrong shape.

Three class prototypes and three features in the plane, at angles chosen so every cosine and every
target angle θ_y is known in closed form; the expected logits are written out with ``math`` from
the papers' formulas (ArcFace s·cos(θ_y + m), CosFace s·(cos θ_y − m), s·cos θ_j elsewhere) and
GeM's (mean_hw max(x, eps)^p)^(1/p) on a 2×2 map.
"""

from __future__ import annotations

import math

import pytest
import torch

from modelupgrade.layers import ArcFace, CosFace, GeM, NormSoftmax
from modelupgrade.layers.margins import MarginClassifier

# Not the kinds' defaults, so a head that ignored what it is given would be caught.
SCALE, MARGIN = 4.0, 0.5
# The cosines are computed in float32 (``MarginClassifier.cosine``); at |logit| ≤ 4 float32 keeps
# them well inside this, and a wrong formula misses by far more.
TOLERANCE = 1e-6

# Prototype j points at angle PROTOTYPE_ANGLES[j]; its length differs per class, which the heads'
# normalisation must remove.
PROTOTYPE_ANGLES = (0.0, math.pi / 2, 3 * math.pi / 4)
PROTOTYPE_LENGTHS = (2.0, 0.5, 3.0)
# Each feature: its label and its angle θ_y to its class's prototype. The first two take the
# ordinary branch of ArcFace (θ_y + m < π); the third is past π − m, ArcFace's other branch.
LABELS = (0, 1, 2)
TARGET_ANGLES = (0.4, 1.3, 2.9)
FEATURE_LENGTHS = (5.0, 0.25, 1.0)


def feature_angle(sample: int) -> float:
    return PROTOTYPE_ANGLES[LABELS[sample]] + TARGET_ANGLES[sample]


def hand_cosines() -> list[list[float]]:
    """cos θ_ij between feature i and prototype j, from the angles alone."""
    return [
        [math.cos(feature_angle(i) - angle) for angle in PROTOTYPE_ANGLES]
        for i in range(len(LABELS))
    ]


def planar_inputs(classifier: MarginClassifier) -> tuple[torch.Tensor, torch.Tensor]:
    """Sets ``classifier``'s prototypes to the planar ones; the features and their labels."""
    prototypes = [
        [length * math.cos(angle), length * math.sin(angle)]
        for angle, length in zip(PROTOTYPE_ANGLES, PROTOTYPE_LENGTHS, strict=True)
    ]
    with torch.no_grad():
        classifier.weight.copy_(torch.tensor(prototypes))
    features = torch.tensor(
        [
            [length * math.cos(feature_angle(i)), length * math.sin(feature_angle(i))]
            for i, length in enumerate(FEATURE_LENGTHS)
        ]
    )
    return features, torch.tensor(LABELS)


def assert_logits(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected), rtol=0.0, atol=TOLERANCE, check_dtype=False
    )


def test_the_planar_inputs_have_the_angles_the_hand_values_assume() -> None:
    classifier = NormSoftmax(2, 3)
    features, _ = planar_inputs(classifier)
    assert_logits(classifier.cosine(features), hand_cosines())
    targets = [hand_cosines()[i][LABELS[i]] for i in range(3)]
    assert targets == pytest.approx([math.cos(theta) for theta in TARGET_ANGLES], abs=1e-12)


def test_arcface_adds_the_angular_margin_to_the_target_class_only() -> None:
    classifier = ArcFace(2, 3, scale=SCALE, margin=MARGIN)
    features, labels = planar_inputs(classifier)
    ordinary = [0, 1]  # θ_y + m < π: s·cos(θ_y + m); the third sample is the next test's
    expected = [[SCALE * c for c in hand_cosines()[i]] for i in ordinary]
    for i in ordinary:
        assert TARGET_ANGLES[i] + MARGIN < math.pi
        expected[i][LABELS[i]] = SCALE * math.cos(TARGET_ANGLES[i] + MARGIN)
    assert_logits(classifier.logits(features, labels)[ordinary], expected)
    assert_logits(classifier(features, labels)[ordinary], expected)


def test_arcface_past_pi_minus_m_keeps_the_target_logit_below_every_margin_logit() -> None:
    # θ_y + m ≥ π: cos(θ_y + m) would rise again with θ; the head gives s·(cos θ_y − 1 − m)
    # instead, below −s, the smallest logit of the ordinary branch, so the logit keeps falling in θ.
    classifier = ArcFace(2, 3, scale=SCALE, margin=MARGIN)
    features, labels = planar_inputs(classifier)
    theta = TARGET_ANGLES[2]
    assert theta + MARGIN >= math.pi
    past = classifier.logits(features, labels)[2]
    expected = [SCALE * c for c in hand_cosines()[2]]
    expected[LABELS[2]] = SCALE * (math.cos(theta) - 1 - MARGIN)
    assert_logits(past[None], [expected])
    assert past[LABELS[2]] < -SCALE


def test_cosface_subtracts_the_cosine_margin_from_the_target_class_only() -> None:
    classifier = CosFace(2, 3, scale=SCALE, margin=MARGIN)
    features, labels = planar_inputs(classifier)
    cosines = hand_cosines()
    expected = [
        [SCALE * (c - MARGIN) if j == LABELS[i] else SCALE * c for j, c in enumerate(row)]
        for i, row in enumerate(cosines)
    ]
    assert_logits(classifier.logits(features, labels), expected)


@pytest.mark.parametrize("kind", [ArcFace, CosFace, NormSoftmax])
def test_without_labels_every_head_gives_the_scaled_cosines(kind: type[MarginClassifier]) -> None:
    # Inference and the confidence heads use margin-free logits.
    classifier = kind(2, 3, scale=SCALE, margin=MARGIN)
    features, _ = planar_inputs(classifier)
    expected = [[SCALE * c for c in row] for row in hand_cosines()]
    assert_logits(classifier.logits(features), expected)
    assert_logits(classifier.cosine(features), hand_cosines())


def test_normalised_softmax_has_no_margin_whatever_is_asked() -> None:
    classifier = NormSoftmax(2, 3, scale=SCALE, margin=MARGIN)
    features, labels = planar_inputs(classifier)
    expected = [[SCALE * c for c in row] for row in hand_cosines()]
    assert_logits(classifier.logits(features, labels), expected)


def test_the_loss_is_cross_entropy_over_the_margin_logits() -> None:
    classifier = CosFace(2, 3, scale=SCALE, margin=MARGIN)
    features, labels = planar_inputs(classifier)
    losses = []
    for i, row in enumerate(hand_cosines()):
        logits = [SCALE * (c - MARGIN) if j == LABELS[i] else SCALE * c for j, c in enumerate(row)]
        losses.append(math.log(sum(math.exp(z) for z in logits)) - logits[LABELS[i]])
    per_sample = classifier.loss(features, labels, reduction="none")
    torch.testing.assert_close(
        per_sample, torch.tensor(losses), rtol=0.0, atol=TOLERANCE, check_dtype=False
    )
    assert classifier.loss(features, labels).item() == pytest.approx(sum(losses) / 3, abs=1e-6)


# -- GeM -------------------------------------------------------------------------------------------

GEM_P, GEM_EPS = 3.0, 1e-6
# One image, two channels, a 2×2 map each. The second channel's zero and negative activation are
# clamped to eps before the power: GeM is a mean of positive responses.
GEM_MAP = ((1.0, 2.0, 3.0, 0.5), (0.0, 4.0, -2.0, 1.0))


def hand_gem(values: tuple[float, ...], p: float = GEM_P, eps: float = GEM_EPS) -> float:
    return (sum(max(v, eps) ** p for v in values) / len(values)) ** (1 / p)


def gem_input() -> torch.Tensor:
    return torch.tensor([[[row[:2], row[2:]] for row in GEM_MAP]])  # (1, 2, 2, 2)


@pytest.mark.parametrize("learnable", [False, True])
def test_gem_is_the_generalised_mean_over_the_spatial_dimensions(learnable: bool) -> None:
    pool = GeM(p=GEM_P, eps=GEM_EPS, learnable=learnable)
    expected = [[hand_gem(channel) for channel in GEM_MAP]]
    # (1³ + 2³ + 3³ + 0.5³)/4 = 36.125/4; (eps³ + 4³ + eps³ + 1³)/4 = 65/4.
    assert expected[0] == pytest.approx([(36.125 / 4) ** (1 / 3), (65 / 4) ** (1 / 3)], rel=1e-12)
    torch.testing.assert_close(
        pool(gem_input()), torch.tensor(expected), rtol=0.0, atol=TOLERANCE, check_dtype=False
    )


def test_gem_of_a_map_of_non_positive_values_is_eps() -> None:
    pool = GeM(p=GEM_P, eps=GEM_EPS)
    pooled = pool(torch.tensor([[[[0.0, -1.0], [-3.0, 0.0]]]]))
    assert float(pooled) == pytest.approx(GEM_EPS, rel=1e-5)


def test_gem_pools_token_sequences_over_the_tokens() -> None:
    # (N, L, C): a ViT's tokens, each of the C channels pooled over the L = 4 tokens.
    pool = GeM(p=GEM_P, eps=GEM_EPS)
    tokens = torch.tensor([list(zip(*GEM_MAP, strict=True))])  # (1, 4, 2)
    expected = [[hand_gem(channel) for channel in GEM_MAP]]
    torch.testing.assert_close(
        pool(tokens), torch.tensor(expected), rtol=0.0, atol=TOLERANCE, check_dtype=False
    )
