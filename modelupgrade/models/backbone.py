"""timm backbones as feature-map extractors, with a CIFAR-style stem for small inputs.

Every backbone is created with ``pretrained=False, num_classes=0, global_pool=""`` so that it
returns its last feature map (NCHW, or tokens for ViT-like models); pooling and the
embedding layer are ours.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelupgrade.errors import UserError


def create_backbone(
    name: str, in_chans: int, cifar_stem: bool, backbone_kwargs: dict[str, Any] | None = None
) -> tuple[nn.Module, int]:
    """Return ``(backbone, feature_channels)`` for the timm model ``name``."""
    # Imported here: timm pulls in torchvision and torch._dynamo (seconds per process), which the
    # stages that only read params.yaml, metrics or embeddings should not pay for.
    import timm

    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0][:6]}*")[:8]
        raise UserError(
            f"timm has no model named {name!r}",
            hint=f"similar names: {', '.join(close) or 'none'}; see timm.list_models()",
        )
    try:
        backbone = timm.create_model(
            name,
            pretrained=False,
            num_classes=0,
            global_pool="",
            in_chans=in_chans,
            **(backbone_kwargs or {}),
        )
    except TypeError as err:
        raise UserError(
            f"timm model {name!r} rejected the backbone_kwargs {backbone_kwargs}: {err}",
            hint="remove or rename the offending key under architectures.<name>.backbone_kwargs",
        ) from None
    if cifar_stem:
        apply_cifar_stem(backbone, name, in_chans)
    features = backbone.num_features  # timm's models say their feature width
    assert isinstance(features, int)
    return backbone, features


def apply_cifar_stem(backbone: nn.Module, name: str, in_chans: int) -> None:
    """Replace the ResNet stem (7×7/2 conv or deep stem, then max-pool) by one 3×3 stride-1 conv.

    On 28×28 or 32×32 inputs the ImageNet stem downsamples by 4 before the first block, leaving a
    7×7 map for four stages; the CIFAR stem keeps full resolution in the first stage.
    """
    conv1, bn1, maxpool = (getattr(backbone, attr, None) for attr in ("conv1", "bn1", "maxpool"))
    if conv1 is None or not isinstance(bn1, nn.BatchNorm2d) or maxpool is None:
        raise UserError(
            f"cifar_stem is only defined for ResNet-family timm models; {name!r} has no "
            "conv1/bn1/maxpool stem",
            hint="set cifar_stem: false for this architecture (and image_size to "
            "what the model expects)",
        )
    backbone.conv1 = nn.Conv2d(
        in_chans, bn1.num_features, kernel_size=3, stride=1, padding=1, bias=False
    )
    nn.init.kaiming_normal_(backbone.conv1.weight, mode="fan_out", nonlinearity="relu")
    backbone.maxpool = nn.Identity()


def probe_feature_shape(backbone: nn.Module, in_chans: int, image_size: int) -> torch.Size:
    """Shape of the backbone's output for one image (checks the input size is accepted)."""
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            return backbone(torch.zeros(1, in_chans, image_size, image_size)).shape
    except Exception as err:  # noqa: BLE001 - timm raises assorted errors for wrong input sizes
        raise UserError(
            f"the backbone does not accept {image_size}×{image_size} inputs with "
            f"{in_chans} channel(s): {err}",
            hint="set image_size (and img_size in backbone_kwargs for "
            "ViT/Swin) in the architecture",
        ) from None
    finally:
        backbone.train(was_training)
