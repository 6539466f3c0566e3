"""JSON data, typed: the one codec from the library's records to the JSON they are written as.

Typed records (frozen dataclasses, pydantic models) cross module boundaries; where one leaves the
library (a ``--json`` result, a JSON file, an SQLite column holding JSON) it becomes ``JsonObject``
here, through ``json_record``. ``JsonValue`` is what ``json.loads`` returns, so mypy checks every
value a record writes; ``number_at``, ``numbers_at``, ``object_at``, ``objects_at`` and
``strings_at`` give a reader of such an object the type it expects, or a TypeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, TypeAlias, Union

import numpy as np

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    JsonValue: TypeAlias = (
        str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
    )
    JsonObject: TypeAlias = dict[str, JsonValue]
else:
    # The same types, as the objects ``typing.get_type_hints`` (the command line's options, a
    # Prefect task's parameters) and pydantic read at run time. A plain recursive alias names
    # "JsonValue" as a string, which they look up in the annotating module, where it is not
    # defined; a TypeAliasType carries its own definition. (mypy reads the branch above: it
    # cannot resolve a recursive TypeAliasType.)
    from typing_extensions import TypeAliasType

    JsonValue = TypeAliasType(
        "JsonValue",
        Union[str, int, float, bool, None, list["JsonValue"], dict[str, "JsonValue"]],  # noqa: UP007
    )
    JsonObject = TypeAliasType("JsonObject", dict[str, JsonValue])


def json_value(value: object) -> JsonValue:
    """``value`` as the JSON data ``json.dumps(value, default=io.json_default)`` writes, so a file
    written from either is byte-identical: records (dataclasses) as objects of their fields, in
    field order; tuples as lists; numpy scalars and arrays as Python numbers and lists; paths as
    strings; integer keys as strings. Any other value is a TypeError, as it is for ``json.dumps``;
    so is any other key than a string or an integer (``_json_key``)."""
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    if isinstance(value, Mapping):
        return {_json_key(key): json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if is_dataclass(value) and not isinstance(value, type):
        return json_record(value)
    if isinstance(value, np.generic | np.ndarray):
        return json_value(value.tolist())  # a scalar's tolist() is its Python number
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def json_record(record: DataclassInstance) -> JsonObject:
    """A record's fields as a JSON object, in field order: what ``dataclasses.asdict`` gives, with
    each value made JSON data by ``json_value``."""
    return {field.name: json_value(getattr(record, field.name)) for field in fields(record)}


def _json_key(key: object) -> str:
    # json.dumps writes an integer key as its digits. It would write a float, bool or None key in
    # its own spelling too, but no record has one: refused here, as a sign of a wrong value.
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    raise TypeError(f"cannot serialise a {type(key).__name__} key to JSON")


def number_at(record: JsonObject, key: str, default: float | None = None) -> float:
    """The number ``record`` holds at ``key`` (an int stays an int), or ``default`` where it holds
    none; a KeyError where it holds none and there is no default, a TypeError where it holds
    something else than a number."""
    if key not in record:
        if default is None:
            raise KeyError(key)
        return default
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key!r} is {value!r}, not a number")
    return value


def numbers_at(record: JsonObject, key: str) -> list[float]:
    """The list of numbers ``record`` holds at ``key``, empty where it holds none; a TypeError
    where it holds something else."""
    values = record.get(key, [])
    if not isinstance(values, list):
        raise TypeError(f"{key!r} is {values!r}, not a list of numbers")
    numbers = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{key!r} holds {value!r}, not a number")
        numbers.append(value)
    return numbers


def object_at(record: JsonObject, key: str) -> JsonObject:
    """The object ``record`` holds at ``key``, empty where it holds none (or null); a TypeError
    where it holds something else."""
    value = record.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{key!r} is {value!r}, not an object")
    return value


def objects_at(record: JsonObject, key: str) -> list[JsonObject]:
    """The list of objects ``record`` holds at ``key``, empty where it holds none; a TypeError
    where it holds something else."""
    return [value for value in _list_at(record, key, dict, "objects") if isinstance(value, dict)]


def strings_at(record: JsonObject, key: str) -> list[str]:
    """The list of strings ``record`` holds at ``key``, empty where it holds none; a TypeError
    where it holds something else."""
    return [value for value in _list_at(record, key, str, "strings") if isinstance(value, str)]


def _list_at(record: JsonObject, key: str, kind: type, what: str) -> list[JsonValue]:
    values = record.get(key) or []
    if not isinstance(values, list) or not all(isinstance(value, kind) for value in values):
        raise TypeError(f"{key!r} is {values!r}, not a list of {what}")
    return values
