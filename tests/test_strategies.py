"""Each compatibility strategy's defining property, on small tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelupgrade.config import ParamsError, parse_params
from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.layers import MLP
from modelupgrade.models import EmbeddingModel
from modelupgrade.plugins import check_params
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


def at_angles(angles: list[float], axis: int, dim: int = 2) -> torch.Tensor:
    """Unit vectors at the given angles (radians) from basis vector ``axis``, rotated towards the
    next basis vector; given as ± pairs they average exactly onto ``axis``."""
    a = torch.tensor(angles, dtype=torch.float64)
    out = torch.zeros(len(angles), dim, dtype=torch.float64)
    out[:, axis] = torch.cos(a)
    out[:, (axis + 1) % dim] = torch.sin(a)
    return out.float()


def test_lce_radius_is_the_max_angle_after_the_iqr_outlier_filter():
    # Class 0: angles 0.1, 0.2, 0.2, 0.3 and one outlier 1.2, each as a ± pair about the x axis,
    # so the class centre is the x axis and the angles to it are exactly these.
    # Sorted: .1 .1 .2 .2 .2 .2 .3 .3 1.2 1.2 → Q1 = 0.2, Q3 = 0.3 (linear interpolation, and
    # AdvBCT's sorted[⌊n/4⌋], sorted[⌊3n/4⌋] alike), fences 0.2 − 0.15 and 0.3 + 0.15: the pair at
    # 1.2 is dropped, the radius is 0.3. The mean of every angle would be 0.4, the plain max 1.2.
    class0 = [s * a for a in (0.1, 0.2, 0.2, 0.3, 1.2) for s in (1, -1)]
    # Class 1: three samples (0, ±0.5 about the y axis); with n ≤ 3 the fences never drop anything.
    class1 = [0.0, 0.5, -0.5]
    old_features = torch.cat([at_angles(class0, axis=0), at_angles(class1, axis=1)])
    labels = torch.tensor([0] * len(class0) + [1] * len(class1))
    old = make_model(2, dim=2, trained=[0, 1])
    context = TrainingContext(
        labels=labels, epochs=1, embed_training_set=lambda m: old_features, old_model=old
    )

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
