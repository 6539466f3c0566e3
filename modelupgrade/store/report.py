"""What a backfill run did (``BackfillReport``): its status, counts and exit code."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from modelupgrade.errors import EXIT_INCOMPLETE, EXIT_STOPPED, UserError
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.store.schema import ItemFailure
from modelupgrade.store.shown import after_failures, item_lines, labelled
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

    def as_dict(self) -> JsonObject:
        return {
            **json_record(self),
            "items_per_second": self.items_per_second,
            "exit_code": self.exit_code,
        }

    def describe(self) -> str:
        where = f" in {self.store}" if self.store else ""
        source = self.source_space or "?"
        lines = [
            f"backfill {self.backfill_id}: {source} → {self.target_space}{where}: {self.status}"
        ]
        if self.already_complete:
            lines.append(labelled("nothing to do", "every item is in the target space already"))
        lines += [
            labelled("items moved", f"{self.items_written:,}"),
            labelled("items failed", f"{self.items_failed:,}"),
            *item_lines(self.failed),
            labelled("chunks committed", f"{self.chunks_committed:,}"),
            labelled("time", f"{self.seconds:,.2f} s ({self.items_per_second:,.1f} items/s)"),
            labelled("exit code", f"{self.exit_code} ({self._exit_meaning()})"),
        ]
        if self.status in ("incomplete", "stopped", "paused"):
            lines.append(labelled("next", self._next_step()))
        return "\n".join(lines)

    def _exit_meaning(self) -> str:
        return {
            "complete": "complete: every planned item is in the target space",
            "incomplete": f"not complete: {self.items_failed:,} item(s) failed and are still "
            f"served from {self.source_space or 'the old space'}",
            "stopped": "stopped (SIGTERM) at a chunk boundary; nothing is lost",
            "paused": "paused after the chunks this run was allowed; nothing is lost",
        }.get(self.status, self.status)

    def _next_step(self) -> str:
        """The command a person runs next on a backfill this run did not finish."""
        if self.status == "incomplete":
            return after_failures(self.store)
        return "run the same backfill command again: it resumes where this run stopped"

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
