"""DMU selective backward compatibility (Zhang et al., Darwinian Model Upgrades), with
forward adaptation.

L = L_new + Σ_x λ(x)·ℓ_arc(φ_new(x); ω_old) + mean ℓ_arc(ψ(φ_old(x)); ω_new).

λ(x) comes from the OLD classifier on the OLD embedding (the printed Alg. 1 uses the new
classifier's logits, which would remove the compatibility constraint):
- ``entropy``: Λ = entropy of softmax over classes of s·⟨φ_old, ω_old⟩;
  λ = (1 − softmax_batch(Λ)) / (N − 1);
- ``least_confidence``: Λ = p_y; λ = softmax_batch(Λ);
- ``uniform``: λ = 1/N (plain BCT, the paper's ablation baseline).
Both sum to 1 over the batch, so the SBC term is a weighted sum, not a mean. The paper's Eq. 9 has
no logit scale; on cosine classifiers that makes every entropy ≈ log C and λ uniform, so the scale
is an option (default: the old classifier's s). ψ = MLP(depth 4, hidden 1024) is trained jointly;
its loss also moves the new classifier. ``regression`` replaces ℓ_arc by 1 − cos in both terms
(Table 7). Old and new models see different random views (Alg. 1).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.json_data import JsonObject
from modelupgrade.layers import MLP
from modelupgrade.models import EmbeddingModel
from modelupgrade.strategies.base import (
    STRATEGIES,
    OldClassifierStrategy,
    StepInputs,
    StrategyOptions,
    TrainingContext,
)
from modelupgrade.strategies.bct import cosine_distance

FORWARD_HEAD_FILE = "forward_head.pt"


class DMUOptions(StrategyOptions):
    old_view: Literal["same", "separate"] = "separate"
    weighting: Literal["entropy", "least_confidence", "uniform"] = "entropy"
    # Scale of ⟨φ_old, ω_old⟩ inside the posterior of Eq. 9/13; None = the old classifier's own s.
    posterior_scale: float | None = Field(default=None, gt=0)
    compatibility_loss: Literal["arcface", "regression"] = "arcface"
    unseen_classes: Literal["synthesise", "mask"] = "synthesise"
    forward_head: bool = True
    head_hidden_dim: int = Field(default=1024, ge=1)
    head_depth: int = Field(default=4, ge=1)


def selective_weights(
    old_cosines: torch.Tensor,
    labels: torch.Tensor,
    scale: float,
    weighting: Literal["entropy", "least_confidence", "uniform"],
) -> torch.Tensor:
    """Per-sample weights λ(x) (summing to 1 over the batch) from the old model's posterior."""
    n = old_cosines.shape[0]
    if weighting == "uniform" or n == 1:
        return torch.full((n,), 1.0 / n, device=old_cosines.device)
    log_p = F.log_softmax(scale * old_cosines.float(), dim=1)
    if weighting == "entropy":
        entropy = -(log_p.exp() * log_p).sum(dim=1)
        return (1.0 - torch.softmax(entropy, dim=0)) / (n - 1)
    true_class_probability = log_p.gather(1, labels[:, None]).squeeze(1).exp()
    return torch.softmax(true_class_probability, dim=0)


@STRATEGIES.register("dmu")
class DMU(OldClassifierStrategy):
    Options = DMUOptions
    options: DMUOptions

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        old_model = context.old_model
        assert old_model is not None
        self.posterior_scale = self.options.posterior_scale or float(self.old_classifier.scale)
        self.psi: MLP | None = None
        if self.options.forward_head:
            self.psi = MLP(
                old_model.embedding_dim,
                new_model.embedding_dim,
                hidden_dim=self.options.head_hidden_dim,
                depth=self.options.head_depth,
            ).to(context.labels.device)

    def weights(
        self, old_features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """λ(x) over the samples that take part (all, or only old-model classes with ``mask``)."""
        keep = torch.ones_like(labels, dtype=torch.bool)
        if self.options.unseen_classes == "mask":
            keep = self.seen_classes[labels]
        weights = torch.zeros(labels.shape[0], device=labels.device)
        if keep.any():
            cosines = self.old_classifier.cosine(old_features[keep])
            weights[keep] = selective_weights(
                cosines, labels[keep], self.posterior_scale, self.options.weighting
            )
        return weights, keep

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        assert step.old_features is not None
        with torch.no_grad():
            weights, _ = self.weights(step.old_features, step.labels)
        if self.options.compatibility_loss == "arcface":
            per_sample = self.old_classifier.loss(step.new_features, step.labels, reduction="none")
        else:
            per_sample = cosine_distance(step.new_features, step.old_features)
        terms = {"dmu_sbc": (weights * per_sample).sum()}
        if self.psi is not None:
            adapted = self.psi(step.old_features)
            if self.options.compatibility_loss == "arcface":
                terms["dmu_fa"] = step.new_model.classifier.loss(adapted, step.labels)
            else:
                terms["dmu_fa"] = cosine_distance(adapted, step.new_features.detach()).mean()
        return terms

    def artifacts(self) -> dict[str, dict[str, torch.Tensor]]:
        if self.psi is None:
            return {}
        return {
            FORWARD_HEAD_FILE: {
                k: v.detach().cpu().clone() for k, v in self.psi.state_dict().items()
            }
        }

    def card_entries(self) -> JsonObject:
        if self.psi is None:
            return {}
        return {
            "forward_head": {
                "file": FORWARD_HEAD_FILE,
                "in_dim": self.psi.in_dim,
                "out_dim": self.psi.out_dim,
                "hidden_dim": self.psi.hidden_dim,
                "hidden": self.psi.hidden_dim,
                "depth": self.psi.depth,
                "batch_norm": True,
                "trained_with": (
                    "dmu forward adaptation (ArcFace of ψ(φ_old) against the new classifier)"
                    if self.options.compatibility_loss == "arcface"
                    else "dmu forward adaptation (1 − cos(ψ(φ_old), φ_new))"
                ),
            }
        }
