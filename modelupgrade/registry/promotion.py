"""Promotion by alias: ``candidate`` after the gates pass, ``champion`` when a person says so."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from modelupgrade.config import GateParams
from modelupgrade.errors import UserError
from modelupgrade.registry.gates import GateInputs, GateReport, evaluate_gates, failed_gates
from modelupgrade.registry.provenance import current_user
from modelupgrade.registry.versions import (
    CANDIDATE,
    CHAMPION,
    TAG_GATES_AGAINST,
    ModelRegistry,
    VersionInfo,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromotionResult:
    version: int
    previous_champion: int | None
    forced: bool
    user: str
    reason: str
    notes: list[str]


def gate_version(
    registry: ModelRegistry, version: int, inputs: GateInputs, params: GateParams
) -> GateReport:
    """Evaluate the gates of ``version`` against the current champion and record them as tags.

    The caller measured ``inputs`` against that champion; the champion's version is stored with
    the verdict so that a later promotion can tell when the comparison has gone stale.
    """
    champion = registry.champion()
    if champion is None:
        raise UserError(
            f"{registry.name!r} has no champion to gate version {version} against",
            hint="the first generation becomes champion when it is registered",
        )
    report = evaluate_gates(inputs, params)
    registry.record_gates(version, report, against=champion.version)
    log.info("%s v%d gates: %s", registry.name, version, report.summary())
    return report


def promote(
    registry: ModelRegistry,
    version: int,
    reason: str,
    *,
    force: bool = False,
    user: str | None = None,
) -> PromotionResult:
    """Move ``champion`` to ``version``; refuse a version whose gates failed unless forced."""
    if not reason or not reason.strip():
        raise UserError(
            "a promotion needs a reason", hint='pass --reason "why this version should serve"'
        )
    target = registry.version(version)
    previous = registry.champion()
    notes: list[str] = []
    if previous is not None and previous.version == target.version:
        raise UserError(f"version {version} of {registry.name!r} is already the champion")
    if not target.promotable:
        if not force:
            failed = _failed_gates(target)
            raise UserError(
                f"version {version} of {registry.name!r} did not pass its gates "
                f"(status: {target.gates_status}{'; failed: ' + failed if failed else ''})",
                hint="promote it anyway with --force and a --reason saying why",
            )
        notes.append(f"forced past gate status '{target.gates_status}'")
    against = target.tags.get(TAG_GATES_AGAINST)
    if previous is not None and against not in (None, "none", str(previous.version)):
        notes.append(
            f"its gates were measured against version {against}, the champion is now "
            f"version {previous.version}"
        )
    who = user or current_user()
    registry.set_alias(CHAMPION, target.version)
    candidate = registry.by_alias(CANDIDATE)
    if candidate is not None and candidate.version == target.version:
        registry.delete_alias(CANDIDATE)
    registry.set_tags(
        target.version,
        {
            "promoted_by": who,
            "promotion_reason": reason.strip(),
            "promoted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "promotion_forced": str(force and not target.promotable).lower(),
            "previous_champion": str(previous.version) if previous else "none",
        },
    )
    log.info("%s: champion -> v%d by %s (%s)", registry.name, target.version, who, reason)
    return PromotionResult(
        version=target.version,
        previous_champion=previous.version if previous else None,
        forced=force and not target.promotable,
        user=who,
        reason=reason.strip(),
        notes=notes,
    )


def _failed_gates(info: VersionInfo) -> str:
    return ", ".join(failed_gates(info.tags))
