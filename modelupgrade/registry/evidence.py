"""The measured numbers the gates and the ``compatible_with`` tags are decided from.

The file format (JSON), keyed by model keys (``gen0``, ``gen1-bct``, ``bct/gen2``)::

    {"metric": "map",
     "models": {"gen0": {"self": 0.52},
                "gen1-bct": {"self": 0.60, "degradation_pct": 3.1}},
     "cross": [{"query": "gen1-bct", "gallery": "gen0", "value": 0.55, "via": "direct",
                "negative_flip_rate": 0.04}]}

``self`` is M(model, model); a ``cross`` row is M(query model, gallery model), ``via`` names the
path (``direct`` or the adapter applied to the stored gallery). Several rows for one pair are
allowed: the best path counts, since that is how the system would serve that gallery.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.errors import UserError
from modelupgrade.io import read_json
from modelupgrade.registry.gates import GateInputs

# The evaluate stage's name for the negative-flip rows of its cross-model table.
NEGATIVE_FLIP_METRIC = "negative_flip_rate"


@dataclass(frozen=True)
class CrossScore:
    value: float
    via: str
    negative_flip_rate: float | None = None


@dataclass(frozen=True)
class GateEvidence:
    metric: str
    self_scores: dict[str, float] = field(default_factory=dict)
    degradation_pct: dict[str, float] = field(default_factory=dict)
    cross: dict[tuple[str, str], CrossScore] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = "gate metrics") -> GateEvidence:
        if not isinstance(raw, Mapping):
            raise UserError(f"{source}: expected a JSON object with 'metric', 'models', 'cross'")
        unknown = set(raw) - {"metric", "models", "cross"}
        if unknown:
            raise UserError(
                f"{source}: unknown keys {sorted(unknown)}",
                hint="allowed top-level keys: metric, models, cross",
            )
        self_scores: dict[str, float] = {}
        degradation: dict[str, float] = {}
        for key, entry in (raw.get("models") or {}).items():
            if not isinstance(entry, Mapping):
                raise UserError(f"{source}: models.{key} must be an object like {{'self': 0.5}}")
            if entry.get("self") is not None:
                self_scores[key] = _number(entry["self"], f"{source}: models.{key}.self")
            if entry.get("degradation_pct") is not None:
                degradation[key] = _number(
                    entry["degradation_pct"], f"{source}: models.{key}.degradation_pct"
                )
        cross: dict[tuple[str, str], CrossScore] = {}
        for i, row in enumerate(raw.get("cross") or []):
            where = f"{source}: cross[{i}]"
            try:
                pair = (str(row["query"]), str(row["gallery"]))
                value = _number(row["value"], f"{where}.value")
            except (KeyError, TypeError):
                raise UserError(f"{where} needs 'query', 'gallery' and 'value'") from None
            nfr = row.get("negative_flip_rate")
            score = CrossScore(
                value,
                str(row.get("via", "direct")),
                None if nfr is None else _number(nfr, f"{where}.negative_flip_rate"),
            )
            best = cross.get(pair)
            if best is None or score.value > best.value:
                if best is not None and score.negative_flip_rate is None:
                    score = CrossScore(score.value, score.via, best.negative_flip_rate)
                cross[pair] = score
        return cls(str(raw.get("metric", "map")), self_scores, degradation, cross)

    @classmethod
    def from_file(cls, path: str | Path) -> GateEvidence:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"gate metrics file {path} does not exist")
        try:
            raw = read_json(path)
        except ValueError as err:
            raise UserError(f"{path} is not valid JSON: {err}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_cross_model_table(
        cls,
        table: Any,
        metric: str,
        model_key: Callable[[str], str] = lambda name: name,
        degradation_pct: Mapping[str, float] | None = None,
    ) -> GateEvidence:
        """Read the evaluate stage's tidy table (query_set, gallery_set, metric, value).

        A set named ``head(model)`` is ``model``'s embeddings passed through ``head``: a forward
        adapter on a gallery or a reverse transform on queries; it counts as a path between the
        two models. ``negative_flip_rate`` rows of the same set pair go with the pair's score.
        ``model_key`` maps the evaluation's model names, those of the table and of
        ``degradation_pct`` (Δ↓ per model, from the evaluation's summary), to registry keys.
        """
        missing = {"query_set", "gallery_set", "metric", "value"} - set(table.columns)
        if missing:
            raise UserError(f"the cross-model table lacks columns {sorted(missing)}")
        if metric not in set(table.metric):
            raise UserError(
                f"the cross-model table has no metric {metric!r}",
                hint=f"it has: {', '.join(sorted(set(table.metric)))}; set registry.gate_metric",
            )
        flips = {
            (r.query_set, r.gallery_set): float(r.value)
            for r in table[table.metric == NEGATIVE_FLIP_METRIC].itertuples()
        }
        # The gate metrics file's shape (``from_dict``): per model its numbers, and the cross rows.
        models: dict[str, dict[str, float]] = {}
        cross: list[dict[str, str | float]] = []
        for r in table[table.metric == metric].itertuples():
            if isinstance(r.value, float) and math.isnan(r.value):
                continue
            q_model, q_head = _split_set_name(r.query_set)
            g_model, g_head = _split_set_name(r.gallery_set)
            q_key, g_key = model_key(q_model), model_key(g_model)
            if r.query_set == r.gallery_set:
                models.setdefault(q_key, {})["self"] = float(r.value)
            elif q_key != g_key:
                via = q_head or g_head or "direct"
                row: dict[str, str | float] = {
                    "query": q_key,
                    "gallery": g_key,
                    "value": float(r.value),
                    "via": via,
                }
                nfr = flips.get((r.query_set, r.gallery_set))
                if nfr is not None and not math.isnan(nfr):
                    row["negative_flip_rate"] = nfr
                cross.append(row)
        for name, value in (degradation_pct or {}).items():
            if value is not None and not math.isnan(value):
                models.setdefault(model_key(name), {})["degradation_pct"] = float(value)
        raw = {"metric": metric, "models": models, "cross": cross}
        return cls.from_dict(raw, "cross-model table")

    def merged(self, other: GateEvidence) -> GateEvidence:
        """``other``'s numbers win where both have one (explicit values override measured)."""
        return GateEvidence(
            other.metric or self.metric,
            {**self.self_scores, **other.self_scores},
            {**self.degradation_pct, **other.degradation_pct},
            {**self.cross, **other.cross},
        )

    def gate_inputs(self, new_key: str, champion_key: str) -> GateInputs:
        cross = self.cross.get((new_key, champion_key))
        return GateInputs(
            cross_score=cross.value if cross else None,
            champion_score=self.self_scores.get(champion_key),
            degradation_pct=self.degradation_pct.get(new_key),
            negative_flip_rate=cross.negative_flip_rate if cross else None,
            metric=self.metric,
        )

    def compatible_galleries(self, query_key: str, gallery_keys: list[str]) -> list[str]:
        """Galleries this model's queries search better than the gallery's own model does."""
        compatible = []
        for gallery in gallery_keys:
            if gallery == query_key:
                continue
            cross = self.cross.get((query_key, gallery))
            own = self.self_scores.get(gallery)
            if cross is not None and own is not None and cross.value > own:
                compatible.append(gallery)
        return compatible


def _split_set_name(name: str) -> tuple[str, str | None]:
    """``bict-bct(gen0)`` -> (``gen0``, ``bict-bct``); a plain model name has no head."""
    if name.endswith(")") and "(" in name:
        head, model = name[:-1].split("(", 1)
        return model, head
    return name, None


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where} must be a number, got {value!r}") from None
    if math.isnan(number):
        raise UserError(
            f"{where} is NaN", hint="the metric was not computed; check the evaluate stage"
        )
    return number
