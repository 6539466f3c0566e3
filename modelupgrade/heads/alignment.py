"""Training-free adapters between two embedding spaces: the linear algebra they share, the modules
that hold their maps, and their base class.

Drift-Adapter (Vejendla, EMNLP 2025, arXiv 2509.23471) fits a small map between an old and a new
embedding space from a sample of paired embeddings (the old and the new model's vectors of the same
images) — orthogonal Procrustes, a low-rank affine map or a small residual MLP — and serves the new
model's queries against the untouched old index. SLERP backward compatibility (Ricci, Biondi,
Pernici, NeurIPS 2026) blends the Procrustes-aligned new query with the old model's query. Here each
is a head kind (``procrustes``, ``affine``, ``residual_mlp``, ``slerp_query``), in both directions
where the direction makes sense:

* query side (reverse, new → old, kinds ``*_query``): the new model's query is mapped into the old
  space and searched against the old gallery as stored: nothing is backfilled;
* gallery side (forward, old → new): the stored old vectors are mapped into the new space once, a
  backfill of vectors only (no image is embedded again), and new-model queries search them.

The closed forms are computed in float64 on the fitting sample and stored as float32 maps; the maps
are parameters without gradients, so the card counts them and ``inference_copy`` leaves them as they
are (one GEMM per batch).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from modelupgrade.config.heads import HeadTraining
from modelupgrade.heads.base import Head, HeadBatch, OptionsT
from modelupgrade.heads.losses import squared_error
from modelupgrade.layers import Transform

# Closed-form kinds run no epochs: these fields are never read (``Head.iterative`` is False),
# and params.yaml may not override them (``modelupgrade.params``). hidden_dim and depth are 1: no
# hidden layer.
CLOSED_FORM = HeadTraining(
    hidden_dim=1, depth=1, epochs=1, batch_size=2, optimizer="sgd", lr=1.0, weight_decay=0.0
)


def orthogonal_procrustes(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The (in × out) map W with orthonormal rows or columns that minimises ‖source·W − target‖_F:
    W = U·Vᵀ from the thin SVD U·Σ·Vᵀ of sourceᵀ·target (Schönemann 1966).

    Equal dimensions give a rotation (or reflection). Different dimensions give a semi-orthogonal
    map: an isometric embedding into the larger space (W·Wᵀ = I, in < out) or an orthogonal
    projection onto an in-dimensional subspace (Wᵀ·W = I, in > out). That is the map that
    zero-padding the smaller side to the larger dimension, solving the square problem and
    dropping the padding gives (the SLERP code pads): the padded rows or columns add nothing to
    sourceᵀ·target.
    """
    cross = source.double().T @ target.double()
    u, _, vh = torch.linalg.svd(cross, full_matrices=False)
    return u @ vh


def reduced_rank_regression(
    source: torch.Tensor, target: torch.Tensor, rank: int, ridge: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, b) of the affine map x ↦ x·A·B + b of rank ``rank`` that minimises the squared error
    on the pairs: centred (ridge) least squares W, then W projected onto the top-``rank`` right
    singular vectors V_r of the fitted values, W_r = W·V_r·V_rᵀ (reduced-rank regression; with the
    identity weight it is the exact least-squares solution under the rank constraint).

    ``ridge`` is relative: λ = ridge · trace(XᵀX) / in (0: plain least squares, minimum-norm where
    the sample has fewer pairs than dimensions).
    """
    x, y = source.double(), target.double()
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - x_mean, y - y_mean
    if ridge > 0:
        gram = xc.T @ xc
        lam = ridge * torch.trace(gram) / gram.shape[0]
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        weight = torch.linalg.solve(gram + lam * eye, xc.T @ yc)
    else:
        weight = torch.linalg.lstsq(xc, yc, driver="gelsd" if xc.device.type == "cpu" else None)
        weight = weight.solution
    _, _, vh = torch.linalg.svd(xc @ weight, full_matrices=False)
    basis = vh[:rank].T  # out × rank
    down, up = weight @ basis, basis.T
    bias = y_mean - (x_mean @ down) @ up
    return down, up, bias


def frozen_parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape), requires_grad=False)


class LinearMap(Transform):
    """x ↦ x·W (+ b) with W stored as (in × out); initialised to the identity padded or cut to
    (in × out), and set by a closed form."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.weight_t = frozen_parameter(in_dim, out_dim)
        with torch.no_grad():
            self.weight_t.copy_(torch.eye(in_dim, out_dim))
        self.bias = frozen_parameter(out_dim) if bias else None

    def set(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight_t.copy_(weight_t.to(self.weight_t))
        if self.bias is not None:
            self.bias.copy_(torch.zeros_like(self.bias) if bias is None else bias.to(self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return x @ self.weight_t
        return torch.addmm(self.bias, x, self.weight_t)

    def macs_per_row(self) -> int:
        return self.weight_t.shape[0] * self.weight_t.shape[1]


class LowRankMap(Transform):
    """x ↦ (x·A)·B + b with A (in × rank) and B (rank × out): rank·(in + out) MACs a row."""

    def __init__(self, in_dim: int, out_dim: int, rank: int) -> None:
        super().__init__()
        self.down = frozen_parameter(in_dim, rank)
        self.up = frozen_parameter(rank, out_dim)
        self.bias = frozen_parameter(out_dim)

    def set(self, down: torch.Tensor, up: torch.Tensor, bias: torch.Tensor) -> None:
        self.down.copy_(down.to(self.down))
        self.up.copy_(up.to(self.up))
        self.bias.copy_(bias.to(self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x @ self.down, self.up)

    def macs_per_row(self) -> int:
        return self.down.shape[1] * (self.down.shape[0] + self.up.shape[1])


class ClosedFormAdapter(Head[OptionsT]):
    """Base of the training-free adapters that are fitted in closed form (no epochs).

    The fit's record is the mean squared error of the map on the fitting pairs (what the closed
    forms minimise); a subclass sets ``direction`` and implements ``fit_closed_form``.
    """

    training_free: ClassVar[bool] = True
    iterative: ClassVar[bool] = False
    TRAINING_DEFAULTS: ClassVar[HeadTraining] = CLOSED_FORM

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        transformed = self(self.source(batch), batch.side_info)
        return squared_error(transformed, self.target(batch), "mean").mean()
