"""Local Drift-Adapters (Politzki, 2026; github.com/jonathan-politzki/mixed-adapter): one adapter
per region of the input space, blended by a soft router,

    A(x) = Σ_k w_k(x) · A_k(x),   w_k(x) = softmax_k(cos(x, μ_k) / τ),

where μ_1…μ_K are k-means centroids of the fitting pairs' inputs and A_k is fitted on the pairs of
cluster k alone (hard membership), each in closed form: orthogonal Procrustes
(``alignment.orthogonal_procrustes``; semi-orthogonal across dimensions) or the low-rank affine
map (``alignment.reduced_rank_regression``). The paper's defaults: K = 8, τ = 0.1, rank 32; it
reports local Procrustes above global Procrustes on its hardest pair (R@1 0.984 vs 0.979,
MiniLM-L6 → E5-large, 384 → 1024) where a global affine map collapsed (0.199).

Deviations, said: the clusters are spherical k-means (cosine, k-means++ seeding from ``seed``) on
the L2-normalised inputs, which the router's cosine assumes (the paper runs FAISS k-means on the
embeddings, normalised by its encoders); a cluster with fewer than ``min_pairs`` pairs takes the
global map fitted on every pair (the paper does not say what a tiny cluster gets); the paper's
drift-aware clustering is left out (it found it within 0.5 % R@1 of plain k-means).

``local_procrustes`` and ``local_affine`` map the stored old vectors into the new space (gallery
side); ``local_procrustes_query`` and ``local_affine_query`` map new-model queries into the old
space (query side). Each costs K maps a vector (K · in · out MACs) plus the router (K · in).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.heads.alignment import (
    ClosedFormAdapter,
    frozen_parameter,
    orthogonal_procrustes,
    reduced_rank_regression,
)
from modelupgrade.layers import Transform


class LocalOptions(Section):
    # K: clusters (adapters), and the router's softmax temperature τ.
    clusters: int = Field(default=8, ge=1)
    temperature: float = Field(default=0.1, gt=0)
    # A cluster with fewer fitting pairs takes the global map.
    min_pairs: int = Field(default=32, ge=2)
    kmeans_iterations: int = Field(default=50, ge=1)
    seed: int = 0


class LocalAffineOptions(LocalOptions):
    rank: int = Field(default=32, ge=1)
    ridge: float = Field(default=1e-3, ge=0)


def spherical_kmeans(
    points: torch.Tensor, clusters: int, iterations: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(unit centroids (K, d), assignment (N,)) of k-means under cosine similarity, seeded by
    k-means++ from ``seed``; an emptied cluster is reseeded at the point worst served."""
    x = F.normalize(points.double(), dim=1)
    k = min(clusters, len(x))
    generator = torch.Generator().manual_seed(seed)
    chosen = [int(torch.randint(len(x), (1,), generator=generator))]
    for _ in range(1, k):
        closest = (x @ x[chosen].T).max(dim=1).values
        weights = (1 - closest).clamp_min(0) + 1e-12
        chosen.append(int(torch.multinomial(weights, 1, generator=generator)))
    centroids = x[chosen].clone()
    assignment = torch.full((len(x),), -1, dtype=torch.long)
    for _ in range(iterations):
        similarity = x @ centroids.T
        new_assignment = similarity.argmax(dim=1)
        if torch.equal(new_assignment, assignment):
            break
        assignment = new_assignment
        for cluster in range(k):
            members = assignment == cluster
            if members.any():
                centroids[cluster] = F.normalize(x[members].sum(0), dim=0)
            else:
                worst = int(similarity.max(dim=1).values.argmin())
                centroids[cluster], assignment[worst] = x[worst], cluster
    return centroids, assignment


class LocalMaps(Transform):
    """x ↦ Σ_k w_k(x)·(x·W_k + b_k), w = softmax(cos(x, μ_k)/τ); K maps of (in × out)."""

    def __init__(self, in_dim: int, out_dim: int, clusters: int, temperature: float) -> None:
        super().__init__()
        self.temperature = temperature
        self.centroids = frozen_parameter(clusters, in_dim)
        self.weights = frozen_parameter(clusters, in_dim, out_dim)
        self.biases = frozen_parameter(clusters, out_dim)
        with torch.no_grad():
            self.weights.copy_(torch.eye(in_dim, out_dim).expand(clusters, -1, -1))

    def set(self, centroids: torch.Tensor, weights: torch.Tensor, biases: torch.Tensor) -> None:
        self.centroids.copy_(centroids.to(self.centroids))
        self.weights.copy_(weights.to(self.weights))
        self.biases.copy_(biases.to(self.biases))

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        """The router's weights (N, K), each row summing to 1."""
        cosine = F.normalize(x, dim=1) @ F.normalize(self.centroids, dim=1).T
        return torch.softmax(cosine / self.temperature, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        route = self.routing(x)
        out = x.new_zeros((len(x), self.weights.shape[2]))
        for k in range(self.weights.shape[0]):
            out += route[:, k : k + 1] * torch.addmm(self.biases[k], x, self.weights[k])
        return out

    def macs_per_row(self) -> int:
        clusters, in_dim, out_dim = self.weights.shape
        return clusters * in_dim * (out_dim + 1)


LocalOptionsT = TypeVar("LocalOptionsT", bound=LocalOptions)


class _LocalAdapter(ClosedFormAdapter[LocalOptionsT]):
    """K closed-form maps fitted per cluster of the inputs, blended by the router."""

    psi: LocalMaps

    def build_transform(self) -> LocalMaps:
        return LocalMaps(self.in_dim, self.out_dim, self.options.clusters, self.options.temperature)

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(W (in × out), b (out)) of one region's closed form."""
        raise NotImplementedError

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        options = self.options
        centroids, assignment = spherical_kmeans(
            source, options.clusters, options.kmeans_iterations, options.seed
        )
        every = self.fit_map(source, target)
        maps = []
        for cluster in range(options.clusters):
            members = assignment == cluster
            enough = cluster < len(centroids) and int(members.sum()) >= options.min_pairs
            maps.append(self.fit_map(source[members], target[members]) if enough else every)
        if len(centroids) < options.clusters:  # fewer pairs than clusters: copies route alike
            extra = torch.arange(options.clusters - len(centroids)) % len(centroids)
            centroids = torch.cat([centroids, centroids[extra]])
        self.psi.set(
            centroids, torch.stack([w for w, _ in maps]), torch.stack([b for _, b in maps])
        )


class LocalProcrustesAdapter(
    _LocalAdapter[LocalOptions], kind="local_procrustes", direction="forward"
):
    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weight = orthogonal_procrustes(source, target)
        return weight, torch.zeros(weight.shape[1], dtype=weight.dtype)


class LocalProcrustesQueryAdapter(
    LocalProcrustesAdapter, kind="local_procrustes_query", direction="reverse"
):
    pass


class LocalAffineAdapter(
    _LocalAdapter[LocalAffineOptions], kind="local_affine", direction="forward"
):
    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rank = min(self.options.rank, self.in_dim, self.out_dim)
        down, up, bias = reduced_rank_regression(source, target, rank, self.options.ridge)
        return down @ up, bias


class LocalAffineQueryAdapter(LocalAffineAdapter, kind="local_affine_query", direction="reverse"):
    pass
