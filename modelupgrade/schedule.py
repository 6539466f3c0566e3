"""The learning-rate schedule of every trainer: the embedding models' (``modelupgrade.training``)
and the heads' (``modelupgrade.heads.training``).

Linear warm-up from base·start_ratio, then cosine down to base·min_ratio, stepped per iteration (as
timm's CosineLRScheduler with t_in_epochs=False in the papers' code).
"""

from __future__ import annotations

import math


def learning_rate(
    step: int,
    total_steps: int,
    warmup_steps: int,
    base_lr: float,
    warmup_start_ratio: float = 1e-3,
    min_ratio: float = 1e-2,
) -> float:
    """The learning rate of optimiser step ``step`` (0-based) of ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        start = base_lr * warmup_start_ratio
        return start + (base_lr - start) * step / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = base_lr * min_ratio
    return floor + 0.5 * (base_lr - floor) * (1.0 + math.cos(math.pi * progress))
