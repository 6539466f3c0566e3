"""What the commands print: a result's ``describe()`` for a person, ``as_dict()`` for ``--json``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from modelupgrade.json_data import JsonObject


class Recorded(Protocol):
    """A card or summary: the record itself (``as_dict``) and its headline numbers."""

    def as_dict(self) -> Any: ...

    def headline_metrics(self) -> Mapping[str, float]: ...


RecordT = TypeVar("RecordT", bound=Recorded)


def metric_lines(metrics: Mapping[str, float]) -> list[str]:
    """One indented ``name  value`` line per metric, names aligned."""
    width = max((len(name) for name in metrics), default=0)
    return [f"  {name:<{width}}  {value:.4g}" for name, value in metrics.items()]


def description(heading: str, record: Recorded, written: Iterable[Path] = ()) -> str:
    """``heading``, the record's headline metrics, then a ``wrote`` line per file."""
    lines = [heading, *metric_lines(record.headline_metrics())]
    return "\n".join([*lines, *(f"wrote {p}" for p in written)])


@dataclass
class WrittenFiles:
    """The files a command wrote."""

    paths: list[Path]

    def as_dict(self) -> list[str]:
        return [str(p) for p in self.paths]

    def describe(self) -> str:
        return "\n".join(f"wrote {p}" for p in self.paths)


@dataclass
class SavedWithCard(Generic[RecordT]):
    """A directory a command saved with its card, and the files written with it. ``names`` are
    ``as_dict``'s keys of the directory and of the files; ``heading`` is what a person reads
    first."""

    out: Path
    card: RecordT
    written: list[Path]
    names: tuple[str, str]
    heading: str

    def as_dict(self) -> JsonObject:
        saved, written = self.names
        return {
            saved: str(self.out),
            "card": self.card.as_dict(),
            written: [str(p) for p in self.written],
        }

    def describe(self) -> str:
        return description(self.heading, self.card, self.written)


@dataclass
class SummaryWritten(Generic[RecordT]):
    """A study step's summary and the directory its tables went to; ``as_dict`` is the summary's,
    ``heading`` says what was written."""

    summary: RecordT
    metrics_dir: Path

    def heading(self) -> str:
        raise NotImplementedError

    def as_dict(self) -> Any:
        return self.summary.as_dict()

    def describe(self) -> str:
        return description(self.heading(), self.summary)
