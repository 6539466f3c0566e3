"""The generation tree of a registered model, rendered from its version tags."""

from __future__ import annotations

from pathlib import Path

from modelupgrade.registry.forms import ADOPTED_KIND, ADOPTED_SOURCE
from modelupgrade.registry.gates import failed_gates
from modelupgrade.registry.versions import (
    TAG_COMPATIBLE_WITH,
    TAG_GENERATION,
    TAG_STRATEGY,
    VersionInfo,
)


def lineage_rows(versions: list[VersionInfo]) -> list[dict[str, str]]:
    """One plain row per version (for tables, JSON and reports)."""
    return [
        {
            "version": str(v.version),
            "model": v.model_key,
            "generation": v.tags.get(TAG_GENERATION, "?"),
            "parent": str(v.parent_version) if v.parent_version is not None else "-",
            "strategy": v.tags.get(TAG_STRATEGY, "?"),
            "origin": _origin(v),
            "gates": _gate_summary(v),
            "compatible_with": v.tags.get(TAG_COMPATIBLE_WITH, "none"),
            "aliases": ",".join(v.aliases) or "-",
        }
        for v in versions
    ]


def format_lineage(name: str, versions: list[VersionInfo]) -> str:
    """A tree: each version under its parent, with strategy, gate verdict and aliases."""
    if not versions:
        return f"{name}: no registered versions"
    by_version = {v.version: v for v in versions}
    children: dict[int | None, list[VersionInfo]] = {}
    for v in versions:
        parent = v.parent_version if v.parent_version in by_version else None
        children.setdefault(parent, []).append(v)
    lines = [name]

    def walk(parent: int | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda v: v.version)
        for i, v in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(prefix + ("└── " if last else "├── ") + _describe(v))
            walk(v.version, prefix + ("    " if last else "│   "))

    walk(None, "")
    return "\n".join(lines)


def _describe(v: VersionInfo) -> str:
    parent = f"v{v.parent_version}" if v.parent_version is not None else "-"
    parts = [
        f"v{v.version} {v.model_key}",
        f"parent={parent}",
        f"strategy={v.tags.get(TAG_STRATEGY, '?')}",
        *([f"origin={_origin(v)}"] if ADOPTED_KIND in v.tags else []),
        f"gates={_gate_summary(v)}",
        f"compatible_with={v.tags.get(TAG_COMPATIBLE_WITH, 'none')}",
    ]
    if v.aliases:
        parts.append("[" + ", ".join(v.aliases) + "]")
    return "  ".join(parts)


def _origin(v: VersionInfo) -> str:
    """``trained`` here, or ``adopted <kind> <source file name>`` (made elsewhere)."""
    kind = v.tags.get(ADOPTED_KIND)
    if kind is None:
        return "trained"
    return f"adopted {kind} {Path(v.tags.get(ADOPTED_SOURCE, '?')).name}"


def _gate_summary(v: VersionInfo) -> str:
    status = v.gates_status
    if status == "true":
        return "pass"
    if status == "false":
        return "FAIL(" + ",".join(failed_gates(v.tags)) + ")"
    return status
