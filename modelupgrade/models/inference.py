"""Batched embedding of uint8 image tensors (eval mode, no augmentation)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from modelupgrade.errors import UserError
from modelupgrade.models.embedding import EmbeddingModel


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA; full float32 on CPU (CPU bf16 is slower and breaks determinism)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def embed_tensor(
    model: EmbeddingModel,
    images: torch.Tensor,
    batch_size: int = 512,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Embed ``images`` (N, C, H, W) with ``model``; returns float32 (N, D) on ``device``."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval().to(device)
    chunks = []
    try:
        with autocast_for(device):
            for start in range(0, images.shape[0], batch_size):
                batch = images[start : start + batch_size].to(device, non_blocking=True)
                chunks.append(model(batch).float())
    finally:
        model.train(was_training)
    if not chunks:
        return torch.empty(0, model.embedding_dim, device=device)
    return torch.cat(chunks)


def embed(
    model: EmbeddingModel,
    uint8_images: torch.Tensor,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Embeddings of ``uint8_images`` (N, C, H, W) as a float32 (N, D) numpy array,
    rows in input order."""
    return (
        embed_tensor(model, uint8_images, batch_size, device)
        .cpu()
        .numpy()
        .astype(np.float32, copy=False)
    )


@torch.no_grad()
def classifier_logits(
    model: EmbeddingModel, embeddings: np.ndarray, batch_size: int = 8192
) -> np.ndarray:
    """The model's scaled cosine logits (no margin) on its own embeddings, float32 (N, classes)."""
    classifier = model.classifier
    if classifier is None:
        raise UserError(
            "the model has no classifier (an adopted model), so it gives no logits",
            hint="order the backfill by a policy that needs no old classifier (random, "
            "fastfill-uncertainty), or store no old-confidence/old-entropy scores",
        )
    device = classifier.weight.device
    chunks = [
        classifier.logits(
            torch.from_numpy(
                np.ascontiguousarray(embeddings[start : start + batch_size], dtype=np.float32)
            ).to(device)
        ).cpu()
        for start in range(0, len(embeddings), batch_size)
    ]
    if not chunks:
        return np.empty((0, classifier.num_classes), dtype=np.float32)
    return torch.cat(chunks).float().numpy()
