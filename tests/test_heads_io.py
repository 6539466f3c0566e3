"""Heads outside training: folded inference, save/load with cards, chains, bad input, the stage."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from modelupgrade.config import ParamsError, parse_params
from modelupgrade.errors import UserError
from modelupgrade.heads import (
    DMUForwardAdapter,
    EmbeddingPairs,
    HeadChain,
    apply,
    apply_with_uncertainty,
    build_head,
    fit_head,
    inference_copy,
    load_chain,
    load_head,
    momentum_input,
    read_head_card,
    resolve_training,
    save_head,
)
from modelupgrade.layers import MLP
from modelupgrade.models import save_model
from modelupgrade.params import check_params
from tests.model_fixtures import tiny_model
from tests.test_heads import DIM, quick_training, synthetic_pairs


def linear_head(matrix: np.ndarray, kind: str = "bict"):
    """A depth-1 head computing x @ matrix.T exactly (for composition arithmetic)."""
    head = build_head(kind, matrix.shape[1], matrix.shape[0], hidden_dim=8, depth=1)
    with torch.no_grad():
        head.psi.net[0].weight.copy_(torch.tensor(matrix, dtype=torch.float32))
        head.psi.net[0].bias.zero_()
    return head.eval()


def test_folded_inference_matches_the_eval_mode_network():
    data, classifier, _ = synthetic_pairs(n=256)
    head = build_head("dmu", DIM, DIM, 32, 4)
    fit_head(head, data, quick_training("dmu", 2, hidden_dim=32, depth=4), classifier=classifier)
    head.eval()
    with torch.no_grad():
        expected = head(torch.from_numpy(data.old)).numpy()
    np.testing.assert_allclose(
        apply(head, data.old, batch_size=100), expected, rtol=1e-4, atol=1e-5
    )
    folded = inference_copy(head)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in folded.modules())
    assert folded.psi.macs_per_row() == head.psi.macs_per_row() == 16 * 32 + 32 * 32 * 2 + 32 * 16


def test_save_load_round_trip_keeps_outputs_and_card(tmp_path):
    data, classifier, _ = synthetic_pairs(n=128)
    head = build_head("fastfill", DIM, DIM, 32, 3, options={"uncertainty_lambda": 0.5})
    fit_head(
        head, data, quick_training("fastfill", 2, hidden_dim=32, depth=3), classifier=classifier
    )
    card = save_head(head, tmp_path / "ff", name="fastfill", training={"epochs": 2})
    assert sorted(p.name for p in (tmp_path / "ff").iterdir()) == ["card.json", "head.pt"]
    torch.load(tmp_path / "ff" / "head.pt", weights_only=True)  # plain tensors only
    loaded, loaded_card = load_head(tmp_path / "ff")
    assert (
        loaded_card.as_dict()
        == json.loads((tmp_path / "ff" / "card.json").read_text())
        == card.as_dict()
    )
    assert (
        card.kind == "fastfill"
        and card.direction == "forward"
        and (card.in_dim, card.out_dim) == (DIM, DIM)
    )
    assert card.hidden_dim == 32 and card.depth == 3
    assert card.options["uncertainty_lambda"] == 0.5
    assert card.macs_per_embedding == head.psi.macs_per_row()
    before = apply_with_uncertainty(head, data.old)
    after = apply_with_uncertainty(loaded, data.old)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_chain_composes_generations_and_mixes_momentum():
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=(DIM, DIM)) for _ in range(3))
    base = rng.normal(size=(20, DIM)).astype(np.float32)
    plain = HeadChain([linear_head(a), linear_head(b)])
    np.testing.assert_allclose(plain.apply(base), base @ a.T @ b.T, rtol=1e-4, atol=1e-4)
    m = 0.5
    with_momentum = HeadChain(
        [linear_head(a), linear_head(b), linear_head(c)], momenta=[0.0, 0.0, m]
    )
    f1 = base @ a.T
    f2 = f1 @ b.T
    f3 = ((1 - m) * f2 + m * f1) @ c.T
    states = with_momentum.gallery_states(base)
    assert len(states) == 4
    np.testing.assert_allclose(states[-1], f3, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        with_momentum.next_input(base, momentum=0.25), 0.75 * f3 + 0.25 * f2, rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(momentum_input(f2, f1, m), (1 - m) * f2 + m * f1, rtol=1e-6)


def test_chain_rejects_reverse_heads_and_dimension_breaks():
    rng = np.random.default_rng(0)
    with pytest.raises(UserError, match="reverse"):
        HeadChain([linear_head(rng.normal(size=(DIM, DIM)), kind="rqt")])
    with pytest.raises(UserError, match="expects 16-d input"):
        HeadChain(
            [linear_head(rng.normal(size=(8, DIM))), linear_head(rng.normal(size=(DIM, DIM)))]
        )
    with pytest.raises(UserError, match="momentum must be 0"):
        HeadChain([linear_head(rng.normal(size=(DIM, DIM)))], momenta=[0.5])
    with pytest.raises(UserError, match="shapes"):
        momentum_input(np.zeros((2, 3)), np.zeros((2, 4)), 0.5)


def test_bad_input_gives_user_errors():
    head = build_head("bict", DIM, DIM, 8, 2).eval()
    with pytest.raises(UserError, match="expects 16-d input"):
        apply(head, np.zeros((4, DIM + 1), dtype=np.float32))
    with pytest.raises(UserError, match="2-D"):
        apply(head, np.zeros(DIM, dtype=np.float32))
    with pytest.raises(UserError, match="no output"):
        apply(head, np.zeros((4, DIM), dtype=np.float32), output="log_variance")
    with pytest.raises(UserError, match="predicts no uncertainty"):
        apply_with_uncertainty(head, np.zeros((4, DIM), dtype=np.float32))
    with pytest.raises(UserError, match="disagree"):
        EmbeddingPairs(np.zeros((4, DIM)), np.zeros((5, DIM)), np.zeros(4, dtype=np.int64))
    with pytest.raises(UserError, match="NaN"):
        EmbeddingPairs(np.full((4, DIM), np.nan), np.zeros((4, DIM)), np.zeros(4, dtype=np.int64))
    data, _, _ = synthetic_pairs(n=32)
    wide = build_head("bict", DIM + 2, DIM, 8, 2)
    with pytest.raises(UserError, match="training embeddings give 16-d inputs"):
        fit_head(wide, data, quick_training("bict", 1))
    with pytest.raises(UserError, match="takes no side information"):
        build_head("bict", DIM, DIM, side_info_dim=4)
    assert len(apply(head, np.zeros((0, DIM), dtype=np.float32))) == 0


def test_fct_side_information_is_an_extra_input():
    data, _, _ = synthetic_pairs(n=128)
    side = np.random.default_rng(0).normal(size=(len(data), 5)).astype(np.float32)
    with_side = EmbeddingPairs(data.old, data.new, data.labels, side)
    head = build_head("fct", DIM, DIM, 16, 2, side_info_dim=5)
    fit_head(head, with_side, quick_training("fct", 1))
    assert apply(head, data.old, side_info=side).shape == data.new.shape
    with pytest.raises(UserError, match="side information"):
        apply(head, data.old)


def save_model_with_joint_head(directory, mlp: MLP | None) -> None:
    """A model saved the way the DMU strategy saves one: ψ beside it, described in its card."""
    model = tiny_model(DIM)
    if mlp is None:
        save_model(model, directory, {})
        return
    entry = {
        "file": "forward_head.pt",
        "in_dim": mlp.in_dim,
        "out_dim": mlp.out_dim,
        "hidden_dim": mlp.hidden_dim,
        "hidden": mlp.hidden_dim,
        "depth": mlp.depth,
        "batch_norm": True,
        "trained_with": "dmu (test)",
    }
    save_model(
        model,
        directory,
        {"forward_head": entry},
        extra_weights={"forward_head.pt": mlp.state_dict()},
    )


def test_dmu_wraps_the_jointly_trained_head(tmp_path):
    mlp = MLP(DIM, DIM, 32, 4)
    save_model_with_joint_head(tmp_path / "dmu", mlp)
    assert DMUForwardAdapter.has_joint_head(tmp_path / "dmu")
    head = DMUForwardAdapter.from_joint_training(tmp_path / "dmu")
    x = torch.randn(7, DIM)
    mlp.eval()
    with torch.no_grad():
        torch.testing.assert_close(head(x), mlp(x))
    save_model_with_joint_head(tmp_path / "plain", None)
    assert not DMUForwardAdapter.has_joint_head(tmp_path / "plain")
    with pytest.raises(UserError, match="no jointly trained forward head"):
        DMUForwardAdapter.from_joint_training(tmp_path / "plain")
    torch.save(MLP(DIM, DIM, 32, 4).state_dict(), tmp_path / "dmu" / "forward_head.pt")
    with pytest.raises(UserError, match="not the file its card describes"):
        DMUForwardAdapter.from_joint_training(tmp_path / "dmu")


def _params(tmp_path, heads: dict):
    raw = {
        "scenarios": {
            "extended-data": {"kind": "extended-data", "old_fraction": 0.3, "strategies": ["bct"]}
        },
        "architectures": {"default": {"backbone": "resnet18", "embedding_dim": DIM}},
        "strategies": {"bct": {"kind": "bct"}},
        "sequential": {"strategies": []},
        "heads": heads,
        "device": "cpu",
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    return parse_params(raw)


def _write_split(tmp_path, data: EmbeddingPairs) -> list[str]:
    """old.npy, new.npy and split.parquet of ``data``; returns the train_heads arguments that name
    them and params.yaml."""
    np.save(tmp_path / "old.npy", data.old)
    np.save(tmp_path / "new.npy", data.new)
    pd.DataFrame({"item_id": [str(i) for i in range(len(data))], "label": data.labels}).to_parquet(
        tmp_path / "split.parquet"
    )
    return [
        "--params",
        str(tmp_path / "params.yaml"),
        "--old-embeddings",
        str(tmp_path / "old.npy"),
        "--new-embeddings",
        str(tmp_path / "new.npy"),
        "--labels",
        str(tmp_path / "split.parquet"),
    ]


def test_stage_trains_saves_and_chains_with_momentum(tmp_path):
    from stages import train_heads

    data, _, _ = synthetic_pairs(n=256)
    args = _write_split(tmp_path, data)
    small = {
        "hidden_dim": 32,
        "depth": 2,
        "epochs": 3,
        "batch_size": 64,
        "optimizer": "adam",
        "lr": 0.01,
    }
    _params(
        tmp_path,
        {
            "bict": {"kind": "bict", **small},
            "bict_mom": {"kind": "bict", "input_momentum": 0.5, **small},
        },
    )
    train_heads.main([*args, "--head", "bict", "--out", str(tmp_path / "gen1")])
    card = read_head_card(tmp_path / "gen1")
    assert card.kind == "bict" and card.training["mode"] == "standalone"
    assert card.training["epochs"] == 3 and len(card.training["epoch_losses"]) == 3
    assert card.sources["old_embeddings"]["sha256"]
    train_heads.main(
        [
            *args,
            "--head",
            "bict",
            "--previous-heads",
            str(tmp_path / "gen1"),
            "--out",
            str(tmp_path / "gen2"),
        ]
    )
    train_heads.main(
        [
            *args,
            "--head",
            "bict_mom",
            "--previous-heads",
            str(tmp_path / "gen1"),
            str(tmp_path / "gen2"),
            "--out",
            str(tmp_path / "gen3"),
        ]
    )
    chain = load_chain(tmp_path / "gen3")
    assert len(chain) == 3 and chain.momenta == [0.0, 0.0, 0.5]
    assert chain.apply(data.old).shape == data.new.shape
    # One momentum entry serves a whole chain: its first head takes F_0 as it is (BiCT Eq. 9).
    train_heads.main([*args, "--head", "bict_mom", "--out", str(tmp_path / "mom1")])
    train_heads.main(
        [
            *args,
            "--head",
            "bict_mom",
            "--previous-heads",
            str(tmp_path / "mom1"),
            "--out",
            str(tmp_path / "mom2"),
        ]
    )
    assert load_chain(tmp_path / "mom2").momenta == [0.0, 0.5]


def test_stage_reports_bad_arguments_cleanly(tmp_path, capsys):
    from stages import train_heads

    data, _, _ = synthetic_pairs(n=64)
    _write_split(tmp_path, data)
    np.save(tmp_path / "short.npy", data.new[:10])
    _params(tmp_path, {"dmu": {"kind": "dmu", "epochs": 1}})
    base = [
        "--params",
        str(tmp_path / "params.yaml"),
        "--old-embeddings",
        str(tmp_path / "old.npy"),
        "--labels",
        str(tmp_path / "split.parquet"),
        "--out",
        str(tmp_path / "out"),
    ]
    with pytest.raises(SystemExit) as exit_info:
        train_heads.main([*base, "--head", "dmu", "--new-embeddings", str(tmp_path / "short.npy")])
    assert exit_info.value.code == 2
    assert "disagree on the number of images" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_heads.main([*base, "--head", "dmu", "--new-embeddings", str(tmp_path / "new.npy")])
    assert "--new-model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_heads.main(
            [*base, "--head", "missing", "--new-embeddings", str(tmp_path / "new.npy")]
        )
    assert "defines no head 'missing'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_resolve_training_uses_paper_defaults_unless_overridden():
    params = parse_params(
        {
            "scenarios": {},
            "architectures": {},
            "strategies": {},
            "sequential": {"strategies": []},
            "heads": {"bict": {"kind": "bict"}, "dmu": {"kind": "dmu", "hidden_dim": 512}},
        }
    )
    bict = resolve_training(params.heads["bict"])
    assert (bict.hidden_dim, bict.depth, bict.lr, bict.batch_size, bict.optimizer) == (
        4096,
        4,
        1.0,
        512,
        "sgd",
    )
    assert resolve_training(params.heads["dmu"]).hidden_dim == 512
    bad_options = parse_params(
        {
            "scenarios": {},
            "architectures": {},
            "strategies": {},
            "sequential": {"strategies": []},
            "heads": {"r": {"kind": "rqt", "options": {"temperatur": 2}}},
        }
    )
    unknown_option = r"heads\.r\.options\.temperatur: .*options of head kind 'rqt'"
    with pytest.raises(ParamsError, match=unknown_option):
        check_params(bad_options)


def test_stage_trains_classifier_heads_and_wraps_a_joint_dmu_head(tmp_path, monkeypatch):
    from stages import train_heads

    data, classifier, _ = synthetic_pairs(n=128)
    split_args = _write_split(tmp_path, data)
    monkeypatch.setattr(
        "modelupgrade.heads.pipeline.load_new_classifier", lambda model_dir: classifier
    )
    small = {"hidden_dim": 16, "depth": 2, "epochs": 2, "batch_size": 64}
    _params(tmp_path, {"ff": {"kind": "fastfill", **small}, "dmu": {"kind": "dmu", **small}})
    model_dir = tmp_path / "model"
    save_model_with_joint_head(model_dir, None)
    args = [*split_args, "--new-model", str(model_dir)]
    train_heads.main([*args, "--head", "ff", "--out", str(tmp_path / "ff")])
    assert load_head(tmp_path / "ff")[1].outputs == ["transform", "log_variance"]
    train_heads.main([*args, "--head", "dmu", "--out", str(tmp_path / "dmu-standalone")])
    assert load_head(tmp_path / "dmu-standalone")[1].training["mode"] == "standalone"

    joint = MLP(DIM, DIM, 24, 3)
    save_model_with_joint_head(model_dir, joint)
    train_heads.main([*args, "--head", "dmu", "--out", str(tmp_path / "dmu-joint")])
    head, card = load_head(tmp_path / "dmu-joint")
    assert card.training["mode"] == "joint" and (card.hidden_dim, card.depth) == (24, 3)
    joint.eval()
    with torch.no_grad():
        expected = joint(torch.from_numpy(data.old)).numpy()
    np.testing.assert_allclose(apply(head, data.old), expected, rtol=1e-4, atol=1e-5)
