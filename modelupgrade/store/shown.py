"""The pieces the store's records share when they read as text (their ``describe()``, what a
command prints without ``--json``): aligned ``label: value`` lines, a time, a bounded list of
failed items."""

from __future__ import annotations

import time
from collections.abc import Sequence

from modelupgrade.store.schema import ItemFailure

# Failed or skipped items named one by one; the rest are counted (``--json`` lists them all).
SHOWN_ITEMS = 10
_LABEL_WIDTH = 18


def utc(at: float) -> str:
    """``at`` (epoch seconds) as a person reads it, in UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def labelled(label: str, value: object) -> str:
    """One indented ``label: value`` line, its value aligned with the others."""
    return f"  {label + ':':<{_LABEL_WIDTH}} {value}"


def continued(value: object) -> str:
    """A further line of the value of the ``labelled`` line above it."""
    return f"  {'':<{_LABEL_WIDTH}} {value}"


def item_lines(items: Sequence[ItemFailure], limit: int = SHOWN_ITEMS) -> list[str]:
    """Up to ``limit`` items with their reasons, one a line, then how many more there are."""
    width = max((len(item.item_id) for item in items[:limit]), default=0)
    lines = [f"    {item.item_id:<{width}}  {item.reason}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"    and {len(items) - limit} more (--json lists them all)")
    return lines


def after_failures(store: str) -> str:
    """What to run about a backfill's failed items (they keep it from completing)."""
    where = f" --store {store}" if store else ""
    return (
        "fix their cause and run the backfill command again with --retry-failed, or undo the "
        f"backfill: `modelupgrade backfill{where} --abort`"
    )
