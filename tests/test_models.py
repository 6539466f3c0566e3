"""Embedding model: shapes, normalisation, stems, channel/size adaptation, save/load round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.models import EmbeddingModel, embed, load_model, read_model_card, save_model

TINY = {
    "backbone": "resnet10t",
    "backbone_kwargs": {"channels": [8, 16, 32, 64], "stem_width": 8},
    "embedding_dim": 16,
}


def tiny_model(**overrides) -> EmbeddingModel:
    arch = ArchitectureParams(**{**TINY, "cifar_stem": False, **overrides})
    return EmbeddingModel(arch, in_chans=1, num_classes=5, input_size=28)


def test_forward_gives_unit_norm_embeddings_of_the_configured_dimension():
    model = tiny_model().eval()
    out = model(torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8))
    assert out.shape == (4, 16)
    assert torch.allclose(out.norm(dim=1), torch.ones(4), atol=1e-5)
    assert model.classifier.weight.shape == (5, 16)


def test_cifar_stem_replaces_the_stem_with_a_stride_one_conv_and_drops_the_max_pool():
    model = tiny_model(cifar_stem=True)
    conv = model.backbone.conv1
    assert isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3) and conv.stride == (1, 1)
    assert conv.in_channels == 1
    assert isinstance(model.backbone.maxpool, nn.Identity)
    # The stem keeps full resolution: the last map of a 4-stage ResNet on 28×28 is 4×4, not 1×1.
    with torch.no_grad():
        assert model.eval().backbone(torch.zeros(1, 1, 28, 28)).shape[-1] == 4


def test_cifar_stem_on_a_non_resnet_model_is_a_user_error():
    with pytest.raises(UserError, match="cifar_stem"):
        EmbeddingModel(
            ArchitectureParams(backbone="mobilenetv3_small_050", cifar_stem=True), 1, 3, 32
        )


def test_unknown_backbone_is_a_user_error():
    with pytest.raises(UserError, match="no model named"):
        EmbeddingModel(ArchitectureParams(backbone="resnet_does_not_exist"), 1, 3, 28)


def test_model_adapts_channel_count_and_size_of_its_input():
    model = EmbeddingModel(
        ArchitectureParams(**{**TINY, "cifar_stem": True, "image_size": 32}), 3, 4, 28
    ).eval()
    grey = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    assert model.prepare_inputs(grey).shape == (2, 3, 32, 32)
    assert model(grey).shape == (2, 16)


@pytest.mark.parametrize("classifier", ["softmax", "arcface", "cosface"])
def test_save_and_load_round_trip_with_weights_only(tmp_path, classifier):
    model = tiny_model(classifier=classifier, gem_learnable=True).eval()
    model.trained_classes = [0, 2, 4]
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    expected = embed(model, images, batch_size=4)
    save_model(model, tmp_path / "m", {"generation": 0, "seed": 3})
    state = torch.load(tmp_path / "m" / "checkpoint.pt", weights_only=True)
    assert "classifier.weight" in state
    loaded = load_model(tmp_path / "m")
    assert not loaded.training
    assert loaded.trained_classes == [0, 2, 4]
    np.testing.assert_allclose(embed(loaded, images, batch_size=3), expected, atol=1e-6)
    card = read_model_card(tmp_path / "m")
    assert card.embedding_dim == 16 and card.classifier.kind == classifier and card.seed == 3
    assert set(card.weights_sha256) == {"checkpoint.pt"}


def test_embed_returns_float32_rows_in_input_order():
    model = tiny_model().eval()
    images = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    whole = embed(model, images, batch_size=5)
    one_by_one = np.concatenate([embed(model, images[i : i + 1], batch_size=1) for i in range(5)])
    assert whole.dtype == np.float32 and whole.shape == (5, 16)
    np.testing.assert_allclose(whole, one_by_one, atol=1e-5)


def test_loading_a_directory_without_a_card_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="card.json"):
        load_model(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(UserError, match="not a model card"):
        load_model(tmp_path)


class _RunsCode:
    """A pickle that would run a shell command when unpickled without weights_only."""

    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


def _rehash(directory, file_name="checkpoint.pt"):
    """Make the card vouch for whatever is in the file now (what an attacker
    with write access does)."""
    from modelupgrade.io import file_sha256

    card = json.loads((directory / "card.json").read_text())
    card["weights_sha256"][file_name] = file_sha256(directory / file_name)
    (directory / "card.json").write_text(json.dumps(card))


def test_a_damaged_replaced_or_malicious_model_directory_is_one_clear_error(tmp_path):
    import pickle

    save_model(tiny_model(), tmp_path / "m", {"generation": 0})
    card_text = (tmp_path / "m" / "card.json").read_text()
    (tmp_path / "m" / "card.json").write_text(card_text[: len(card_text) // 2])
    with pytest.raises(UserError, match="not valid JSON"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "card.json").write_text(
        json.dumps({**json.loads(card_text), "embedding_dim": "wide"})
    )
    with pytest.raises(UserError, match="not a valid model card: embedding_dim"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "card.json").write_text(card_text)
    other = tmp_path / "other"
    torch.manual_seed(1)
    save_model(tiny_model(), other, {"generation": 0})
    (tmp_path / "m" / "checkpoint.pt").write_bytes((other / "checkpoint.pt").read_bytes())
    with pytest.raises(UserError, match="not the file its card describes"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "checkpoint.pt").write_bytes(pickle.dumps(_RunsCode()))
    _rehash(tmp_path / "m")
    with pytest.raises(UserError, match="cannot be loaded as weights"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "checkpoint.pt").write_bytes((other / "checkpoint.pt").read_bytes()[:100])
    _rehash(tmp_path / "m")
    with pytest.raises(UserError, match="cannot be loaded as weights"):
        load_model(tmp_path / "m")
