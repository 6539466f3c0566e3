"""Each compatibility strategy's defining property, on small tensors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from modelupgrade.config import ParamsError, parse_params
from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.layers import MLP
from modelupgrade.models import EmbeddingModel
from modelupgrade.params import check_params
from modelupgrade.strategies import (
    STRATEGIES,
    StepInputs,
    TrainingContext,
    build_strategy,
    compatibility_info_nce,
    propagation_weights,
    refined_prototypes,
    selective_weights,
)

DIM = 8
TINY = {
    "backbone": "resnet10t",
    "backbone_kwargs": {"channels": [8, 8, 8, 8], "stem_width": 8},
    "cifar_stem": False,
}


def make_model(
    num_classes: int, dim: int = DIM, trained: list[int] | None = None
) -> EmbeddingModel:
    model = EmbeddingModel(ArchitectureParams(**TINY, embedding_dim=dim), 1, num_classes, 16)
    model.trained_classes = trained
    return model


def clustered(labels: torch.Tensor, centres: torch.Tensor, noise: float = 0.1) -> torch.Tensor:
    return F.normalize(centres[labels] + noise * torch.randn(len(labels), centres.shape[1]), dim=1)


@pytest.fixture
def world():
    """An old model trained on classes 0..2 whose classifier rows are the class
    centres; 4 classes now."""
    centres = F.normalize(torch.randn(4, DIM), dim=1)
    labels = torch.arange(4).repeat_interleave(6)
    old_features = clustered(labels, centres)
    old = make_model(3, trained=[0, 1, 2])
    old.classifier.weight.data.copy_(centres[:3])
    context = TrainingContext(
        labels=labels, epochs=3, embed_training_set=lambda m: old_features, old_model=old
    )
    return centres, labels, old_features, old, context


def step(labels, new, old_features, model, epoch=0):
    return StepInputs(labels, new, old_features, model, epoch)


def test_registry_lists_every_strategy_of_the_papers():
    assert set(STRATEGIES.names()) >= {
        "independent",
        "bct",
        "regression",
        "focal_distillation",
        "lce",
        "unibct",
        "dmu",
        "ract",
        "contrastive",
    }
    with pytest.raises(UserError, match="choose one of"):
        build_strategy("nope")
    with pytest.raises(UserError, match="not valid"):
        build_strategy("bct", {"weigth": 1})


def test_params_schema_validates_strategy_options():
    base = {"scenarios": {}, "architectures": {"default": {}}, "sequential": {"strategies": []}}

    def check(strategy: dict) -> None:
        check_params(parse_params({**base, "strategies": {"u": strategy}}))

    check({"kind": "unibct", "options": {"warmup_epochs": 1}})
    with pytest.raises(ParamsError, match=r"strategies\.u\.options\.graph_lambda: .*'unibct'"):
        check({"kind": "unibct", "options": {"graph_lambda": 1.5}})
    with pytest.raises(ParamsError, match="strategies.u.kind: unknown strategy 'bogus'"):
        check({"kind": "bogus"})


def test_strategies_comparing_embeddings_refuse_a_dimension_change(world):
    *_, _old, context = world
    new = make_model(4, dim=DIM * 2)
    for kind in ("bct", "regression", "dmu", "unibct", "lce", "ract", "focal_distillation"):
        with pytest.raises(UserError, match="same dimension"):
            build_strategy(kind, {"warmup_epochs": 1} if kind == "unibct" else {}).setup(
                new, context
            )
    build_strategy("independent").setup(new, context)


def test_bct_loss_of_the_old_model_itself_is_its_own_classification_loss_and_minimal(world):
    centres, labels, old_features, _, _ = world
    old = make_model(4)  # trained on every class: the BCT classifier is exactly the old one
    old.classifier.weight.data.copy_(centres)
    context = TrainingContext(
        labels=labels, epochs=3, embed_training_set=lambda m: old_features, old_model=old
    )
    bct = build_strategy("bct")
    new = make_model(4)
    bct.setup(new, context)
    same = bct.losses(step(labels, old_features, None, new))["bct"]
    assert torch.allclose(same, old.classifier.loss(old_features, labels))
    random = bct.losses(step(labels, F.normalize(torch.randn(len(labels), DIM), dim=1), None, new))[
        "bct"
    ]
    assert same < 0.1 * random


def test_bct_synthesises_classifier_rows_for_classes_the_old_model_never_saw(world):
    _centres, labels, old_features, old, context = world
    bct = build_strategy("bct")
    bct.setup(make_model(4), context)
    weight = bct.old_classifier.weight
    assert torch.allclose(weight[:3], F.normalize(old.classifier.weight, dim=1))
    assert torch.allclose(
        weight[3], F.normalize(old_features[labels == 3].mean(0), dim=0), atol=1e-6
    )
    assert bct.seen_classes.tolist() == [True, True, True, False]
    masked = build_strategy("bct", {"unseen_classes": "mask"})
    masked.setup(make_model(4), context)
    only_new = labels == 3
    assert (
        masked.losses(step(labels[only_new], old_features[only_new], None, make_model(4)))["bct"]
        == 0
    )


def test_regression_is_lambda_times_one_minus_cosine(world):
    _, labels, old_features, _, context = world
    reg = build_strategy("regression")
    assert reg.options.weight == 2.0  # BiCT stage 1
    reg.setup(make_model(4), context)
    assert reg.losses(step(labels, old_features, old_features, None))["regression"].abs() < 1e-6
    assert torch.isclose(
        reg.losses(step(labels, old_features, -old_features, None))["regression"], torch.tensor(4.0)
    )


def test_dmu_entropy_weights_sum_to_one_and_favour_confident_old_samples():
    cos = torch.tensor([[0.9, 0.0, 0.0], [0.3, 0.3, 0.2], [0.0, 0.8, 0.1]])
    labels = torch.tensor([0, 0, 1])
    weights = selective_weights(cos, labels, scale=30.0, weighting="entropy")
    assert torch.isclose(weights.sum(), torch.tensor(1.0))
    assert weights[1] < weights[0] and weights[1] < weights[2]  # the ambiguous sample counts least
    assert (weights <= 1.0 / (len(labels) - 1)).all()
    lc = selective_weights(cos, labels, scale=30.0, weighting="least_confidence")
    assert torch.isclose(lc.sum(), torch.tensor(1.0)) and lc[1] < lc[0]
    assert torch.allclose(selective_weights(cos, labels, 30.0, "uniform"), torch.full((3,), 1 / 3))


def test_dmu_weights_come_from_the_old_model_and_psi_is_trained_and_exported(world):
    _, labels, old_features, _old, context = world
    dmu = build_strategy("dmu")
    assert dmu.options.old_view == "separate"
    new = make_model(4)
    dmu.setup(new, context)
    weights, _ = dmu.weights(old_features, labels)
    assert torch.isclose(weights.sum(), torch.tensor(1.0))
    new_features = F.normalize(torch.randn(len(labels), DIM), dim=1).requires_grad_()
    terms = dmu.losses(step(labels, new_features, old_features, new))
    assert set(terms) == {"dmu_sbc", "dmu_fa"}
    sum(terms.values()).backward()
    assert dmu.psi.net[0].weight.grad is not None and new.classifier.weight.grad is not None
    entry = dmu.card_entries()["forward_head"]
    assert (entry["in_dim"], entry["out_dim"], entry["hidden_dim"], entry["depth"]) == (
        DIM,
        DIM,
        1024,
        4,
    )
    psi = MLP(entry["in_dim"], entry["out_dim"], entry["hidden_dim"], entry["depth"])
    psi.load_state_dict(dmu.artifacts()["forward_head.pt"])
    no_head = build_strategy("dmu", {"forward_head": False})
    no_head.setup(make_model(4), context)
    assert no_head.artifacts() == {} and "dmu_fa" not in no_head.losses(
        step(labels, new_features, old_features, new)
    )

    # A hand-made batch. The old classifier's rows are the basis, so its cosines are the old
    # features: sample 0 is certain of class 0, sample 1 torn between classes 0 and 1, sample 2
    # between all three. The new embeddings are each certain of one class, so weights taken from
    # them (or uniform ones) would be equal; sample 0's is right, the others' wrong, so their
    # ArcFace losses differ and so does the weighted sum.
    old, old_features, labels, context = basis_world(
        3, [0, 1, 2], [0, 1, 2], [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    )
    new_features = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])

    def by_hand(s: float) -> torch.Tensor:
        """Eq. 9 (entropy over classes of the old posterior), then Eq. 10 (over the batch)."""
        logits = s * old_features.double()
        p = torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True)
        entropy = -(p * p.log()).sum(1)
        batch_softmax = torch.exp(entropy) / torch.exp(entropy).sum()
        return ((1 - batch_softmax) / (len(labels) - 1)).float()

    # With s = 30 the entropies are 0, ln 2 and ln 3: e^Λ ∝ 1, 2, 3, so λ = (5, 4, 3)/12.
    assert torch.allclose(by_hand(30.0), torch.tensor([5.0, 4.0, 3.0]) / 12, atol=1e-6)
    dmu = build_strategy("dmu")
    new = make_model(3, dim=3)
    dmu.setup(new, context)
    assert dmu.posterior_scale == old.classifier.scale == 30.0  # the old classifier's own s
    weights, keep = dmu.weights(old_features, labels)
    assert keep.all() and torch.allclose(weights, by_hand(30.0), atol=1e-6)
    terms = dmu.losses(step(labels, new_features, old_features, new))
    # SBC: the λ-weighted sum of the new embeddings' ArcFace losses against the old classifier.
    per_sample = old.classifier.loss(new_features, labels, reduction="none")
    assert per_sample[0] < 0.1 * per_sample[1]
    assert torch.isclose(terms["dmu_sbc"], (by_hand(30.0) * per_sample).sum(), rtol=1e-5)
    # FA: ψ maps the OLD embeddings, and the NEW classifier must classify them.
    assert torch.isclose(
        terms["dmu_fa"], new.classifier.loss(dmu.psi(old_features), labels), rtol=1e-5
    )
    scaled = build_strategy("dmu", {"posterior_scale": 1.0})
    scaled.setup(make_model(3, dim=3), context)
    assert torch.allclose(scaled.weights(old_features, labels)[0], by_hand(1.0), atol=1e-6)
    assert not torch.allclose(by_hand(1.0), by_hand(30.0), atol=1e-2)


def test_unibct_refined_prototypes_differ_from_plain_class_means():
    torch.manual_seed(1)
    labels = torch.zeros(6, dtype=torch.long)
    new = F.normalize(
        torch.tensor([[1.0, 0.0]] * 5 + [[0.0, 1.0]]) + 0.05 * torch.randn(6, 2), dim=1
    )
    old = torch.randn(6, 3)
    refined = refined_prototypes(new, old, labels, 1, method="refined")
    plain = refined_prototypes(new, old, labels, 1, method="mean")
    assert not torch.allclose(refined, plain, atol=1e-3)
    weights = propagation_weights(new, 0.9, 0.05)
    assert torch.isclose(weights.sum(), torch.tensor(1.0), atol=1e-5)
    assert weights[5] < weights[:5].min()  # the outlier in new-feature space counts least
    # The paper's Alg. 2 normalises columns: then 1ᵀA = 1ᵀ and the prototype is exactly the mean.
    unit = F.normalize(new, dim=1)
    sim = (unit @ unit.t() / 0.05).fill_diagonal_(float("-inf"))
    column_stochastic = torch.softmax(sim, dim=0)
    a = 0.1 * torch.linalg.inv(torch.eye(6) - 0.9 * column_stochastic)
    assert torch.allclose(a.sum(0), torch.ones(6), atol=1e-4)


def test_unibct_singleton_class_prototype_is_its_only_old_feature():
    old = torch.tensor([[3.0, 4.0]])
    proto = refined_prototypes(torch.tensor([[1.0, 0.0]]), old, torch.tensor([0]), 1)
    assert torch.allclose(proto, torch.tensor([[0.6, 0.8]]))


def test_unibct_waits_for_its_warm_up_then_uses_regenerated_prototypes(world):
    _, labels, old_features, _, context = world
    with pytest.raises(UserError, match="warm-up"):
        build_strategy("unibct").setup(make_model(4), context)  # 10 warm-up epochs ≥ 3 epochs
    uni = build_strategy("unibct", {"warmup_epochs": 1, "refresh_every": 1})
    new = make_model(4)
    uni.setup(new, context)
    assert uni.losses(step(labels, old_features, old_features, new, epoch=0)) == {}
    uni.on_epoch_start(1, new, context)
    assert uni.compat_classifier.weight.norm(dim=1).min() > 0.99
    assert uni.losses(step(labels, old_features, old_features, new, epoch=1))["unibct"] > 0

    # A tiny graph, by hand. Class 0 has three images: in the new model's space images 0 and 1
    # coincide and image 2 is orthogonal to both, so with τ = 0.05 (e^-20 ≈ 0) the row-normalised
    # edges with a zero diagonal are Ẽ = [[0, 1, 0], [1, 0, 0], [½, ½, 0]]. The prototype is
    # (1/m)·1ᵀAV⁰ with A = (1 − λ)(I − λẼ)⁻¹; Aᵀ1 = (1 − λ)c where (I − λẼ)ᵀc = 1, i.e. c₃ = 1
    # and c₁ = c₂ = (1 + λ/2)/(1 − λ): the old features weigh (1 + λ/2, 1 + λ/2, 1 − λ)/3,
    # (1.45, 1.45, 0.1)/3 at λ = 0.9. Class 1 has two images: Ẽ swaps them and the prototype is
    # their plain mean. Column normalisation (the printed Alg. 2), edges from the old features
    # (orthogonal here) or no refinement at all would all give class 0 the plain mean.
    eye = torch.eye(DIM)
    old_features = torch.stack(
        [eye[0], eye[1], eye[2], eye[3], F.normalize(eye[3] + eye[4], dim=0)]
    )
    labels = torch.tensor([0, 0, 0, 1, 1])
    new_space = {"features": torch.stack([eye[0], eye[0], eye[1], eye[5], eye[6]])}
    old = make_model(2, trained=[0, 1])
    context = TrainingContext(
        labels=labels,
        epochs=4,
        embed_training_set=lambda m: old_features if m is old else new_space["features"],
        old_model=old,
    )
    lam = 0.9  # the default graph λ
    class0_weights = torch.tensor([1 + lam / 2, 1 + lam / 2, 1 - lam]) / 3
    refined = F.normalize(
        torch.stack([class0_weights @ old_features[:3], old_features[3:].mean(0)]), dim=1
    )
    means = F.normalize(torch.stack([old_features[:3].mean(0), old_features[3:].mean(0)]), dim=1)
    assert not torch.allclose(refined[0], means[0], atol=0.1)
    uni = build_strategy("unibct", {"warmup_epochs": 1, "refresh_every": 2})
    new = make_model(2)
    uni.setup(new, context)
    batch = F.normalize(torch.randn(5, DIM), dim=1)
    # During the warm-up there is no compatibility term and no prototype has been made yet.
    uni.on_epoch_start(0, new, context)
    assert uni.losses(step(labels, batch, old_features, new, epoch=0)) == {}
    assert (uni.compat_classifier.weight == 0).all()
    uni.on_epoch_start(1, new, context)  # end of the warm-up: the first regeneration
    assert torch.allclose(uni.compat_classifier.weight, refined, atol=1e-5)
    # The loss is ArcFace (the new classifier's s and m) against exactly these prototypes.
    expected = copy.deepcopy(new.classifier)
    expected.weight.data.copy_(refined)
    loss = uni.losses(step(labels, batch, old_features, new, epoch=1))["unibct"]
    assert torch.isclose(loss, expected.loss(batch, labels), rtol=1e-5)
    # Regenerated every `refresh_every` epochs from the current new model only: if every image of
    # a class coincides in the new space, Ẽ is uniform, A symmetric and the prototype the mean.
    new_space["features"] = torch.stack([eye[0]] * 5)
    uni.on_epoch_start(2, new, context)
    assert torch.allclose(uni.compat_classifier.weight, refined, atol=1e-5)
    uni.on_epoch_start(3, new, context)
    assert torch.allclose(uni.compat_classifier.weight, means, atol=1e-5)
    # UniBCT* (`prototype: mean`) uses the old class means whatever the new model's graph.
    new_space["features"] = torch.stack([eye[0], eye[0], eye[1], eye[5], eye[6]])
    star = build_strategy("unibct", {"warmup_epochs": 1, "prototype": "mean"})
    star.setup(make_model(2), context)
    star.on_epoch_start(1, new, context)
    assert torch.allclose(star.compat_classifier.weight, means, atol=1e-5)


def test_focal_distillation_weights_old_correct_samples_more(world):
    _, labels, old_features, _, context = world
    fd = build_strategy("focal_distillation")
    fd.setup(make_model(4), context)
    wrong = old_features.clone()
    # a class-0 sample the old model calls class 1
    wrong[0] = F.normalize(fd.old_prototypes[1], dim=0)
    weights = fd.sample_weights(wrong, labels)
    assert weights[0] == fd.options.alpha
    assert weights[1] == fd.options.alpha + fd.options.beta
    assert (weights[labels == 3] == fd.options.alpha).all()  # the old model cannot know class 3
    assert (
        fd.losses(step(labels, old_features, old_features, None))["focal_distillation"].abs() < 1e-6
    )


def test_lce_boundary_is_zero_inside_the_old_class_boundary_and_alignment_pulls_prototypes(world):
    _, labels, old_features, _, context = world
    lce = build_strategy("lce")
    new = make_model(4)
    lce.setup(new, context)
    at_centres = lce.centres[labels]
    new.classifier.weight.data.copy_(lce.centres)
    terms = lce.losses(step(labels, at_centres, old_features, new))
    assert terms["lce_boundary"] < 1e-6 and terms["lce_alignment"] < 1e-5
    far = lce.losses(step(labels, -at_centres, old_features, new))
    assert far["lce_boundary"] > 1.0

    # By hand: the centres are the x and y axes, the radii 0.3 and 0.5 (see the radius test).
    old_features, labels, context = two_axis_world()
    lce = build_strategy("lce")
    new = make_model(2, dim=2)
    lce.setup(new, context)
    assert lce.radii.tolist() == pytest.approx([0.3, 0.5], abs=1e-5)
    # New embeddings at 0.5 and -0.1 rad from the x axis (class 0), 0.9 and -1.0 rad from the y
    # axis (class 1): relu(angle − r) = 0.2, 0, 0.4, 0.5, mean 0.275. A flipped sign would give
    # 0.05, the mean radii (0.2, 1/3) 0.383, no radius at all the mean angle 0.625.
    batch_labels = torch.tensor([0, 0, 1, 1])
    embeddings = torch.cat([at_angles([0.5, -0.1], axis=0), at_angles([0.9, -1.0], axis=1)])
    # The new classifier's prototypes (unnormalised): class 0's at 60° from its centre
    # (1 − cos = 0.5), class 1's orthogonal to its centre (1 − cos = 1): alignment 0.75 over the
    # classes of the batch, 1.0 for a batch of class 1 only.
    new.classifier.weight.data.copy_(
        torch.cat([3.0 * at_angles([math.pi / 3], axis=0), 2.0 * at_angles([math.pi / 2], axis=1)])
    )
    terms = lce.losses(step(batch_labels, embeddings, None, new))
    assert terms["lce_boundary"].item() == pytest.approx(0.275, abs=1e-5)
    assert terms["lce_alignment"].item() == pytest.approx(0.75, abs=1e-5)
    only_class_1 = lce.losses(step(batch_labels[2:], embeddings[2:], None, new))
    assert only_class_1["lce_boundary"].item() == pytest.approx(0.45, abs=1e-5)
    assert only_class_1["lce_alignment"].item() == pytest.approx(1.0, abs=1e-5)
    weighted = build_strategy("lce", {"boundary_weight": 2.0, "alignment_weight": 3.0})
    weighted.setup(make_model(2, dim=2), context)
    terms = weighted.losses(step(batch_labels, embeddings, None, new))
    assert terms["lce_boundary"].item() == pytest.approx(2 * 0.275, abs=1e-5)
    assert terms["lce_alignment"].item() == pytest.approx(3 * 0.75, abs=1e-5)


def test_ract_adds_new_to_new_negatives_to_the_contrastive_loss():
    torch.manual_seed(2)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    old = F.normalize(torch.randn(6, DIM), dim=1)
    new = F.normalize(old + 0.3 * torch.randn(6, DIM), dim=1)
    plain = compatibility_info_nce(new, old, labels, 0.05, new_negatives=False)
    ract = compatibility_info_nce(new, old, labels, 0.05, new_negatives=True)
    assert ract > plain
    assert compatibility_info_nce(old, old, labels, 0.05, False) < compatibility_info_nce(
        new, old, labels, 0.05, False
    )
    assert (
        build_strategy("ract").options.new_negatives
        and not build_strategy("contrastive").options.new_negatives
    )

    # By hand on four 2-d samples at known angles (dot products are cosines of angle differences),
    # τ = 0.5: anchor i's positive is its own old embedding; its negatives are the old embeddings
    # of the other class's images and, for RACT only, their new embeddings. Same-class images
    # (old or new) and the anchor's own new embedding are never negatives.
    labels = torch.tensor([0, 0, 1, 1])
    old_angles, new_angles = [0.0, 0.4, 1.6, 2.0], [0.2, 0.3, 1.2, 1.9]
    old, new = at_angles(old_angles, axis=0), at_angles(new_angles, axis=0)

    def by_hand(new_negatives: bool) -> float:
        total = 0.0
        for i in range(4):
            others = [k for k in range(4) if labels[k] != labels[i]]
            logits = [math.cos(new_angles[i] - old_angles[i]) / 0.5]
            logits += [math.cos(new_angles[i] - old_angles[k]) / 0.5 for k in others]
            if new_negatives:
                logits += [math.cos(new_angles[i] - new_angles[k]) / 0.5 for k in others]
            total += -logits[0] + math.log(sum(math.exp(z) for z in logits))
        return total / 4

    with_new, without_new = by_hand(True), by_hand(False)
    assert with_new > without_new + 0.1
    assert compatibility_info_nce(new, old, labels, 0.5, True).item() == pytest.approx(
        with_new, rel=1e-5
    )
    assert compatibility_info_nce(new, old, labels, 0.5, False).item() == pytest.approx(
        without_new, rel=1e-5
    )
    # The strategies: RACT's loss has the new-to-new negatives, plain contrastive's does not.
    inputs = step(labels, new, old, None)
    ract_loss = build_strategy("ract", {"temperature": 0.5, "weight": 2.0}).losses(inputs)
    plain_loss = build_strategy("contrastive", {"temperature": 0.5}).losses(inputs)
    assert ract_loss["ract"].item() == pytest.approx(2 * with_new, rel=1e-5)
    assert plain_loss["contrastive"].item() == pytest.approx(without_new, rel=1e-5)


def at_angles(angles: list[float], axis: int, dim: int = 2) -> torch.Tensor:
    """Unit vectors at the given angles (radians) from basis vector ``axis``, rotated towards the
    next basis vector; given as ± pairs they average exactly onto ``axis``."""
    a = torch.tensor(angles, dtype=torch.float64)
    out = torch.zeros(len(angles), dim, dtype=torch.float64)
    out[:, axis] = torch.cos(a)
    out[:, (axis + 1) % dim] = torch.sin(a)
    return out.float()


def two_axis_world() -> tuple[torch.Tensor, torch.Tensor, TrainingContext]:
    """2-d old embeddings of two classes whose centres are exactly the x and the y axis.

    Class 0: angles 0.1, 0.2, 0.2, 0.3 and one outlier 1.2, each as a ± pair about the x axis,
    so the class centre is the x axis and the angles to it are exactly these.
    Class 1: three samples (0, ±0.5 about the y axis).
    """
    class0 = [s * a for a in (0.1, 0.2, 0.2, 0.3, 1.2) for s in (1, -1)]
    class1 = [0.0, 0.5, -0.5]
    old_features = torch.cat([at_angles(class0, axis=0), at_angles(class1, axis=1)])
    labels = torch.tensor([0] * len(class0) + [1] * len(class1))
    old = make_model(2, dim=2, trained=[0, 1])
    context = TrainingContext(
        labels=labels, epochs=1, embed_training_set=lambda m: old_features, old_model=old
    )
    return old_features, labels, context


def test_lce_radius_is_the_max_angle_after_the_iqr_outlier_filter():
    # Class 0 (two_axis_world), sorted: .1 .1 .2 .2 .2 .2 .3 .3 1.2 1.2 → Q1 = 0.2, Q3 = 0.3
    # (linear interpolation, and AdvBCT's sorted[⌊n/4⌋], sorted[⌊3n/4⌋] alike), fences 0.2 − 0.15
    # and 0.3 + 0.15: the pair at 1.2 is dropped, the radius is 0.3. The mean of every angle would
    # be 0.4, the plain max 1.2.
    # Class 1: three samples (0, ±0.5 about the y axis); with n ≤ 3 the fences never drop anything.
    _, _, context = two_axis_world()

    def radii(options: dict) -> list[float]:
        lce = build_strategy("lce", options)
        lce.setup(make_model(2, dim=2), context)
        assert torch.allclose(lce.centres, torch.eye(2), atol=1e-6)
        return lce.radii.tolist()

    assert radii({}) == pytest.approx([0.3, 0.5], abs=1e-5)
    assert radii({"radius_outlier_iqr": None}) == pytest.approx([1.2, 0.5], abs=1e-5)
    # The mean statistic is taken over the same filtered angles: (2·0.1 + 4·0.2 + 2·0.3) / 8.
    mean = radii({"radius": "mean"})
    assert mean[0] == pytest.approx(0.2, abs=1e-5)
    with pytest.raises(UserError, match="not valid"):
        build_strategy("lce", {"radius_outlier_iqr": 0})


def basis_world(old_classes: int, trained: list[int], labels: list[int], old: list, dim: int = 3):
    """An old model whose classifier rows are the basis vectors, so that its cosine logits are the
    (normalised) old features themselves, and a training context over ``labels``."""
    model = make_model(old_classes, dim=dim, trained=trained)
    model.classifier.weight.data.copy_(torch.eye(old_classes, dim))
    old_features = F.normalize(torch.tensor(old, dtype=torch.float32), dim=1)
    label_tensor = torch.tensor(labels)
    context = TrainingContext(
        labels=label_tensor, epochs=1, embed_training_set=lambda m: old_features, old_model=model
    )
    return model, old_features, label_tensor, context


def test_focal_kl_is_t_squared_times_kl_at_temperature_t():
    old, old_features, labels, context = basis_world(
        3, [0, 1, 2], [0, 1, 2], [[0.6, 0.8, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    )
    new_features = F.normalize(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8], [0.8, 0.0, 0.6]]))
    s = old.classifier.scale
    # Hand-made logits: the old classifier's rows are the basis, so logits are s · features.
    old_logits, new_logits = s * old_features, s * new_features
    # Old-correct: sample 0 (label 0, old argmax 1) is wrong, samples 1 and 2 right (α 1, β 5).
    weights = torch.tensor([1.0, 6.0, 6.0])

    def by_hand(t: float) -> torch.Tensor:
        p = torch.exp(old_logits / t) / torch.exp(old_logits / t).sum(1, keepdim=True)
        q = torch.exp(new_logits / t) / torch.exp(new_logits / t).sum(1, keepdim=True)
        kl = (p * (p.log() - q.log())).sum(1)
        return (weights * t**2 * kl).mean()

    def loss(options: dict) -> torch.Tensor:
        fd = build_strategy("focal_distillation", {"distance": "kl", **options})
        fd.setup(make_model(3, dim=3), context)
        return fd.losses(step(labels, new_features, old_features, None))["focal_distillation"]

    assert build_strategy("focal_distillation").options.temperature == 100.0  # PCT's T
    assert torch.isclose(loss({}), by_hand(100.0), rtol=1e-4)
    assert torch.isclose(loss({"temperature": 4.0}), by_hand(4.0), rtol=1e-4)
    assert torch.isclose(loss({"temperature": 1.0}), by_hand(1.0), rtol=1e-4)
    assert not torch.isclose(by_hand(4.0), by_hand(1.0), rtol=1e-2)


def test_focal_old_correct_is_false_for_labels_the_old_classifier_does_not_have():
    from modelupgrade.strategies.focal import old_model_correct

    # Hand-made cosine logits against a 2-class old classifier (rows = basis): every sample's
    # old argmax is class 0 or 1, the labels reach 3.
    features = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.2], [0.1, 1.0]]))
    labels = torch.tensor([0, 1, 2, 3])
    weight = torch.eye(2)
    both = torch.tensor([True, True])
    assert old_model_correct(features, labels, weight, both).tolist() == [True, True, False, False]
    # An old classifier that has none of these classes (open-class: it was trained elsewhere in
    # the label space) is right on no sample; nothing is indexed out of range.
    neither = torch.tensor([False, False])
    assert old_model_correct(features, labels, weight, neither).tolist() == [False] * 4
    assert old_model_correct(features[:2], labels[:2], weight, neither).tolist() == [False] * 2

    # Through the strategy: the old model was trained on classes 3..5 only, the new set has 0..2.
    _, old_features, labels, context = basis_world(
        6, [3, 4, 5], [0, 0, 1, 2], [[1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0, 0, 1.0]]
    )
    fd = build_strategy("focal_distillation")
    fd.setup(make_model(3, dim=3), context)
    assert fd.seen_classes.tolist() == [False, False, False]
    assert fd.sample_weights(old_features, labels).tolist() == [fd.options.alpha] * 4
