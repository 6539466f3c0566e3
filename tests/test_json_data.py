"""The one codec from records to JSON (``modelupgrade.json_data``): what it writes is what
``json.dumps`` wrote of the same value, and its readers refuse what is not the JSON they read."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pydantic
import pytest

from modelupgrade.io import json_default
from modelupgrade.json_data import (
    JsonObject,
    json_record,
    json_value,
    number_at,
    numbers_at,
    object_at,
    objects_at,
    strings_at,
)


@dataclass(frozen=True)
class Inner:
    name: str
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Outer:
    path: Path
    inner: Inner
    counts: dict[int, np.int64]
    vector: np.ndarray
    scale: np.float32
    flags: list[bool] = field(default_factory=lambda: [True, False])
    missing: float | None = None


def written(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=json_default)


def test_a_record_is_written_byte_for_byte_as_json_dumps_wrote_it() -> None:
    record = Outer(
        Path("/data/x.npy"),
        Inner("a", (1, 2)),
        {3: np.int64(4)},
        np.arange(3, dtype=np.float32) / 3,
        np.float32(0.1),
        missing=float("nan"),
    )
    assert written(json_record(record)) == written(asdict(record))
    assert list(json_record(record)) == [
        "path",
        "inner",
        "counts",
        "vector",
        "scale",
        "flags",
        "missing",
    ]
    assert json_record(record)["inner"] == {"name": "a", "sizes": [1, 2]}


@pytest.mark.parametrize("value", [object(), {1.5: "x"}, {"a": {"b": {1, 2}}}])
def test_what_json_cannot_hold_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        json_value(value)


def test_the_alias_resolves_where_it_is_used_at_run_time() -> None:
    # Command-line options and Prefect read hints with get_type_hints; pydantic validates with it.
    def command(x: int) -> JsonObject:
        return {"x": x}

    assert typing.get_type_hints(command)["return"] is JsonObject

    class Holder(pydantic.BaseModel):
        record: JsonObject = {}

    held = Holder(record={"n": 1, "f": 1.0, "b": True, "l": [None, "s", {"k": 2.5}]})
    assert held.model_dump_json() == (
        '{"record":{"n":1,"f":1.0,"b":true,"l":[null,"s",{"k":2.5}]}}'
    )
    with pytest.raises(pydantic.ValidationError):
        Holder(record={"x": object()})


def test_the_readers_take_what_is_there_and_refuse_what_is_not() -> None:
    record: JsonObject = {
        "n": 3,
        "x": 0.5,
        "flag": True,
        "losses": [1.0, 2],
        "names": ["a", "b"],
        "inner": {"k": 1},
        "rows": [{"a": 1}],
        "none": None,
    }
    assert number_at(record, "n") == 3 and isinstance(number_at(record, "n"), int)
    assert number_at(record, "absent", 0) == 0
    assert numbers_at(record, "losses") == [1.0, 2] and numbers_at(record, "absent") == []
    assert strings_at(record, "names") == ["a", "b"] and strings_at(record, "absent") == []
    assert object_at(record, "inner") == {"k": 1} and object_at(record, "none") == {}
    assert objects_at(record, "rows") == [{"a": 1}] and objects_at(record, "absent") == []
    with pytest.raises(KeyError):
        number_at(record, "absent")
    for read, key in [
        (number_at, "flag"),
        (number_at, "names"),
        (numbers_at, "names"),
        (strings_at, "losses"),
        (object_at, "rows"),
        (objects_at, "names"),
    ]:
        with pytest.raises(TypeError):
            read(record, key)
