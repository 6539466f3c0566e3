"""The upgraded systems of one scenario that the backfill simulator compares, found in the
pipeline's embedding layout (``embeddings/<scenario>/...``, as dvc.yaml writes it).

Each strategy of the scenario is a system served with its new model alone (``gen1-<strategy>``).
Each head of the scenario adds a system ``<head>-<strategy>``: that strategy's new model plus the
head's outputs (``modelupgrade.heads.write_head_outputs``): ψ(old gallery) and FastFill's σ² for a
forward adapter, ψ_rev(new query) for a reverse transform, and ρ for Seo et al.'s full method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modelupgrade.config import Params
from modelupgrade.heads.evaluation_outputs import RHO_GALLERY_FILE, RHO_QUERY_FILE, SIGMA2_FILE

OLD_MODEL_DIR = "gen0"
OLD_LOGITS_FILE = "gallery_logits.npy"


@dataclass(frozen=True)
class ScenarioVariants:
    old: Path
    variants: dict[str, str]
    arrays: dict[str, dict[str, str]] = field(default_factory=dict)
    old_logits: Path | None = None


def _head_arrays(directory: Path) -> dict[str, str]:
    files = {p.name: str(p) for p in directory.glob("*.npy")}
    arrays: dict[str, str] = {}
    if "gallery.npy" in files:
        arrays["forward_gallery"] = files["gallery.npy"]
    if SIGMA2_FILE in files:
        arrays["sigma2"] = files[SIGMA2_FILE]
    if RHO_QUERY_FILE in files:
        # The full method's query transform acts on ρ(φ_new(q)), not on φ_new(q).
        arrays["rho_query"] = files[RHO_QUERY_FILE]
        arrays["rho_gallery"] = files[RHO_GALLERY_FILE]
        arrays["rho_reverse_query"] = files["query.npy"]
    elif "query.npy" in files:
        arrays["reverse_query"] = files["query.npy"]
    return arrays


def scenario_variants(params: Params, scenario: str, embeddings_root: str | Path) -> ScenarioVariants:
    scenario_params = params.scenario(scenario)
    root = Path(embeddings_root) / scenario
    variants = {s: str(root / f"gen1-{s}") for s in scenario_params.strategies}
    arrays: dict[str, dict[str, str]] = {}
    for head, strategy in scenario_params.heads.items():
        name = f"{head}-{strategy}"
        variants[name] = variants[strategy]
        arrays[name] = _head_arrays(root / name)
    logits = root / OLD_MODEL_DIR / OLD_LOGITS_FILE
    return ScenarioVariants(root / OLD_MODEL_DIR, variants, arrays, logits if logits.is_file() else None)
