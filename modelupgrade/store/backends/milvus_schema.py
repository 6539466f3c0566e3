"""The collections a store keeps in Milvus: a space's (one row per item slot: its vector, its
provenance, the write that made it authoritative and the one that moved its item out) and the
state collection its serving state is published in."""

from __future__ import annotations

import re
from typing import Any

from modelupgrade.config.store import StoreIndexParams
from modelupgrade.store.backends.milvus_search import INDEX_TYPES, build_params
from modelupgrade.store.spaces import SpaceSpec

MODEL_REF_LENGTH = 4096
# Milvus's longest VARCHAR: an item id longer than this (in UTF-8) is kept in the store only, and
# its row's item_id is empty (an outside reader names such an item by its slot).
ITEM_ID_BYTES = 65535
# The state fields of a collection's row; a collection without ``wb`` was written by an earlier
# modelupgrade.
STATE_FIELDS = ("wb", "wc", "mb", "mc")


def collection_part(space: str) -> str:
    """A space name as a collection name's part (letters, digits and '_' only; injective)."""
    return re.sub(r"[^A-Za-z0-9]", lambda m: f"_{ord(m.group()):02x}", space)


def kept_id(item_id: str) -> str:
    """An item id as a row keeps it: whole when Milvus's VARCHAR holds it, else empty."""
    return item_id if len(item_id.encode("utf-8", "surrogatepass")) <= ITEM_ID_BYTES else ""


def create_space_collection(
    client: Any, name: str, spec: SpaceSpec, index_params: StoreIndexParams, metric: str
) -> None:
    """The collection ``name`` of ``spec``, indexed as ``index_params`` says for ``metric``."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(
        auto_id=False, enable_dynamic_field=False, description=spec.name
    )
    schema.add_field("slot", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=spec.dim)
    schema.add_field("space", DataType.VARCHAR, max_length=128)
    schema.add_field("model_ref", DataType.VARCHAR, max_length=MODEL_REF_LENGTH)
    schema.add_field("checksum", DataType.INT64)
    schema.add_field("source_hash", DataType.INT64)
    schema.add_field("item_id", DataType.VARCHAR, max_length=ITEM_ID_BYTES)
    for state in STATE_FIELDS:
        schema.add_field(state, DataType.INT64)
    index = client.prepare_index_params()
    index.add_index(
        field_name="vector",
        index_type=INDEX_TYPES[index_params.kind],
        metric_type=metric,
        params=build_params(index_params),
    )
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")


def create_state_collection(client: Any, name: str) -> None:
    """The collection of one row the store's serving state is published in."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", DataType.INT64, is_primary=True)
    schema.add_field("state", DataType.VARCHAR, max_length=ITEM_ID_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus wants one
    index = client.prepare_index_params()
    index.add_index(field_name="vector", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
