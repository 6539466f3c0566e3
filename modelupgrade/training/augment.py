"""Batched training augmentation on uint8 image tensors: random resized crop and horizontal flip.

Used by the training engine and, sharded over processes, by ``modelupgrade.training.distributed``.

One affine sampling grid per image, all images resampled in a single ``grid_sample`` call, so the
hot loop has no per-sample Python. Random numbers come from a CPU generator (bit-identical streams
on CPU and GPU, and resumable by seeding per epoch) and are moved to the images' device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class BatchAugment:
    def __init__(
        self,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: bool = True,
    ) -> None:
        if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
        self.crop_scale = crop_scale
        self.log_ratio = (math.log(crop_ratio[0]), math.log(crop_ratio[1]))
        self.hflip = hflip

    def crop_parameters(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Affine matrices (n, 2, 3) mapping output coordinates into the source
        image ([-1, 1] units)."""
        uniform = torch.rand(n, 5, generator=generator)
        area = self.crop_scale[0] + (self.crop_scale[1] - self.crop_scale[0]) * uniform[:, 0]
        ratio = torch.exp(
            self.log_ratio[0] + (self.log_ratio[1] - self.log_ratio[0]) * uniform[:, 1]
        )
        width = torch.sqrt(area * ratio).clamp(max=1.0)
        height = torch.sqrt(area / ratio).clamp(max=1.0)
        centre_x = (1.0 - width) * (2.0 * uniform[:, 2] - 1.0)
        centre_y = (1.0 - height) * (2.0 * uniform[:, 3] - 1.0)
        flip = torch.where(uniform[:, 4] < 0.5, -1.0, 1.0) if self.hflip else torch.ones(n)
        theta = torch.zeros(n, 2, 3)
        theta[:, 0, 0] = width * flip
        theta[:, 0, 2] = centre_x
        theta[:, 1, 1] = height
        theta[:, 1, 2] = centre_y
        return theta

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 (N, C, H, W) → augmented float (N, C, H, W) in [0, 1] at the same size."""
        n, c, h, w = images.shape
        theta = self.crop_parameters(n, generator).to(images.device)
        grid = F.affine_grid(theta, [n, c, h, w], align_corners=False)
        x = images.float() / 255.0
        return F.grid_sample(
            x, grid, mode="bilinear", padding_mode="reflection", align_corners=False
        )
