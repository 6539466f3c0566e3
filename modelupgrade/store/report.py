"""What a backfill run did (``BackfillReport``): its status, counts and exit code."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from modelupgrade.errors import EXIT_INCOMPLETE, EXIT_STOPPED, UserError
from modelupgrade.store.schema import ItemFailure
from modelupgrade.store.status import StoreStatus


@dataclass
class BackfillReport:
    backfill_id: int
    target_space: str
    # complete: every planned item is in the target space; incomplete: nothing is pending but
    # items failed; stopped: SIGTERM; paused: the run's max_chunks
    status: str
    chunks_committed: int
    items_written: int
    items_failed: int
    seconds: float
    failed: list[ItemFailure] = field(default_factory=list)
    store: str = ""
    source_space: str = ""
    # the run found the backfill complete already (a re-run after the last commit): nothing to do
    already_complete: bool = False

    @property
    def items_per_second(self) -> float:
        return (self.items_written + self.items_failed) / self.seconds if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        return {"incomplete": EXIT_INCOMPLETE, "stopped": EXIT_STOPPED}.get(self.status, 0)

    @property
    def exit_message(self) -> str | None:
        """The error line of a run that did not finish the backfill."""
        where = f" --store {self.store}" if self.store else ""
        if self.status == "incomplete":
            return (
                f"{len(self.failed)} item(s) failed and are still served from space "
                f"{self.source_space!r}, so backfill {self.backfill_id} into "
                f"{self.target_space!r} is not complete; `modelupgrade store-status{where}` "
                "lists them (failed) with the reason of each\n  hint: fix their cause and run "
                "the backfill again with --retry-failed, or undo it with "
                f"`modelupgrade backfill{where} --abort`"
            )
        if self.status == "stopped":
            return (
                f"backfill {self.backfill_id} into {self.target_space!r} was stopped (SIGTERM) "
                f"at a chunk boundary after {self.chunks_committed} chunk(s) of this run\n  hint: "
                "run the same command again to resume it"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "items_per_second": self.items_per_second,
            "exit_code": self.exit_code,
        }

    def describe(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    @classmethod
    def whole_backfill(cls, status: StoreStatus, run_status: str) -> BackfillReport:
        """The totals of the store's last backfill, across every run that worked on it (a
        ``BackfillJob.run`` covers the chunks of one run only), as the store records them;
        ``run_status`` is how the latest run ended."""
        backfill = status.backfill
        if backfill is None:
            raise UserError(f"the store at {status.path} has not run a backfill")
        ended = backfill.finished_at or time.time()
        return cls(
            backfill_id=backfill.id,
            target_space=backfill.target_space,
            status=run_status,
            chunks_committed=backfill.chunks_committed,
            items_written=backfill.done,
            items_failed=backfill.failed,
            seconds=ended - backfill.started_at,
            failed=list(status.failed),
            store=status.path,
            source_space=backfill.source_space,
        )
