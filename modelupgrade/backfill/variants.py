"""The upgraded systems of one scenario that the backfill simulator compares, found in the
study's embedding layout (``embeddings/<scenario>/...``, ``modelupgrade.layout``).

Each strategy of the scenario is a system served with its new model alone (``gen1-<strategy>``).
Each head of the scenario adds a system ``<head>-<strategy>``: that strategy's new model plus the
head's outputs (``modelupgrade.heads.write_head_outputs``): ψ(old gallery) and FastFill's σ² for a
forward adapter, ψ_rev(new query) for a reverse transform, and ρ for Seo et al.'s full method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modelupgrade.config import Params
from modelupgrade.layout import (
    GALLERY_SPLIT,
    OLD_MODEL,
    QUERY_SPLIT,
    RHO_GALLERY_FILE,
    RHO_QUERY_FILE,
    SIGMA2_FILE,
    StudyLayout,
    embedding_file_name,
    head_name,
    model_name,
)

GALLERY_FILE = embedding_file_name(GALLERY_SPLIT)
QUERY_FILE = embedding_file_name(QUERY_SPLIT)


@dataclass(frozen=True)
class ScenarioVariants:
    old: Path
    variants: dict[str, str]
    arrays: dict[str, dict[str, str]] = field(default_factory=dict)
    old_logits: Path | None = None
    # Variants whose new model was trained to be compared with the old vectors (BCT family).
    compatible: frozenset[str] = frozenset()


def _head_arrays(directory: Path) -> dict[str, str]:
    files = {p.name: str(p) for p in directory.glob("*.npy")}
    arrays: dict[str, str] = {}
    if GALLERY_FILE in files:
        arrays["forward_gallery"] = files[GALLERY_FILE]
    if SIGMA2_FILE in files:
        arrays["sigma2"] = files[SIGMA2_FILE]
    if RHO_QUERY_FILE in files:
        # The full method's query transform acts on ρ(φ_new(q)), not on φ_new(q).
        arrays["rho_query"] = files[RHO_QUERY_FILE]
        arrays["rho_gallery"] = files[RHO_GALLERY_FILE]
        arrays["rho_reverse_query"] = files[QUERY_FILE]
    elif QUERY_FILE in files:
        arrays["reverse_query"] = files[QUERY_FILE]
    return arrays


def scenario_variants(params: Params, scenario: str, layout: StudyLayout) -> ScenarioVariants:
    """Every strategy and head of ``scenario`` as a system, with the embeddings in ``layout``."""
    scenario_params = params.scenario(scenario)
    variants = {
        s: str(layout.embeddings(scenario, model_name(1, s))) for s in scenario_params.strategies
    }
    compatible = {
        s for s in scenario_params.strategies if params.strategies[s].kind != "independent"
    }
    arrays: dict[str, dict[str, str]] = {}
    for head, strategy in scenario_params.heads.items():
        name = head_name(head, strategy)
        variants[name] = variants[strategy]
        arrays[name] = _head_arrays(layout.head_outputs(scenario, name))
        if strategy in compatible:
            compatible.add(name)
    logits = layout.logits_file(scenario, OLD_MODEL, GALLERY_SPLIT)
    return ScenarioVariants(
        layout.embeddings(scenario, OLD_MODEL),
        variants,
        arrays,
        logits if logits.is_file() else None,
        frozenset(compatible),
    )
