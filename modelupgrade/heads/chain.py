"""Sequential upgrades: forward adapters compose over generations, optionally with BiCT momentum.

The stored gallery evolves as F_0 = φ_0(g) and F_i = ψ_i(input_i) with

    input_i = F_{i−1}                               (plain composition ψ_i ∘ … ∘ ψ_1)
    input_i = (1 − m_i)·F_{i−1} + m_i·F_{i−2}      (BiCT "+mom", i ≥ 2, m = 0.5 in the paper)

so a momentum chain must keep one extra generation of gallery vectors. Each head's card records its
``input_momentum`` and the heads it follows, so one head directory identifies its whole chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head
from modelupgrade.heads.inference import DEFAULT_BATCH_SIZE, apply
from modelupgrade.heads.persistence import load_head, read_head_card


def momentum_input(
    previous: np.ndarray, before_previous: np.ndarray, momentum: float
) -> np.ndarray:
    """(1 − m)·F_{i−1} + m·F_{i−2}."""
    if previous.shape != before_previous.shape:
        raise UserError(
            f"the momentum input mixes two gallery generations of shapes {previous.shape} and "
            f"{before_previous.shape}; they must match",
            hint="BiCT momentum needs all generations in one embedding dimension; "
            "set input_momentum: 0",
        )
    return ((1.0 - momentum) * previous + momentum * before_previous).astype(np.float32, copy=False)


class HeadChain:
    """Forward heads ψ_1 … ψ_n applied in generation order to generation-0 gallery vectors."""

    def __init__(self, heads: Sequence[Head], momenta: Sequence[float] | None = None) -> None:
        self.heads = list(heads)
        self.momenta = [0.0] * len(self.heads) if momenta is None else [float(m) for m in momenta]
        if len(self.momenta) != len(self.heads):
            raise UserError(f"{len(self.momenta)} momenta for {len(self.heads)} heads")
        for i, head in enumerate(self.heads):
            if head.direction != "forward":
                raise UserError(
                    f"generation {i + 1} of the chain is a {head.direction} head "
                    f"({head.registry_name!r})",
                    hint="only forward adapters (old → new) compose over gallery generations",
                )
            if head.side_info_dim:
                raise UserError("heads with side information cannot be chained")
            if not 0.0 <= self.momenta[i] <= 1.0:
                raise UserError(f"momentum must lie in [0, 1], got {self.momenta[i]}")
        if self.momenta and self.momenta[0] != 0.0:
            raise UserError(
                "the first head of a chain has no F_{i-2} to mix in; its momentum must be 0"
            )
        for i in range(1, len(self.heads)):
            if self.heads[i].in_dim != self.heads[i - 1].out_dim:
                raise UserError(
                    f"generation {i + 1} expects {self.heads[i].in_dim}-d input but generation {i} "
                    f"produces {self.heads[i - 1].out_dim}-d vectors"
                )

    def __len__(self) -> int:
        return len(self.heads)

    def input_of(self, states: Sequence[np.ndarray], momentum: float) -> np.ndarray:
        """Input of the next generation's head given the gallery states F_0 … F_{i−1}."""
        if momentum and len(states) >= 2:
            return momentum_input(states[-1], states[-2], momentum)
        return states[-1]

    def gallery_states(
        self,
        base: np.ndarray,
        batch_size: int = DEFAULT_BATCH_SIZE,
        device: torch.device | str | None = None,
    ) -> list[np.ndarray]:
        """[F_0, F_1, …, F_n] for generation-0 vectors ``base``."""
        states = [np.ascontiguousarray(base, dtype=np.float32)]
        for head, momentum in zip(self.heads, self.momenta, strict=True):
            states.append(apply(head, self.input_of(states, momentum), batch_size, device=device))
        return states

    def apply(
        self,
        base: np.ndarray,
        batch_size: int = DEFAULT_BATCH_SIZE,
        device: torch.device | str | None = None,
    ) -> np.ndarray:
        """F_n: the gallery after every generation's refresh."""
        return self.gallery_states(base, batch_size, device)[-1]

    def next_input(
        self, base: np.ndarray, momentum: float = 0.0, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> np.ndarray:
        """Training input of generation n + 1's head (the chain's gallery state, momentum-mixed)."""
        return self.input_of(self.gallery_states(base, batch_size), momentum)

    def macs_per_embedding(self) -> int:
        return sum(head.macs_per_embedding()["transform"] for head in self.heads)


def load_chain(head_dir: str | Path, device: torch.device | str = "cpu") -> HeadChain:
    """The chain ending in ``head_dir``: its card's ``previous_heads`` in order, then itself."""
    card = read_head_card(head_dir)
    dirs = [*card.previous_heads, str(head_dir)]
    heads, momenta = [], []
    for directory in dirs:
        head, head_card = load_head(directory, device)
        heads.append(head)
        momenta.append(head_card.input_momentum)
    return HeadChain(heads, momenta)
