"""The Milvus vector backend: the store's vectors in Milvus, one collection per embedding space.

The same client code talks to Milvus Lite (``store.uri``: a local ``.db`` file, by default
``vectors/milvus.db`` inside the store directory; an embedded engine, nothing to start) and to a
Milvus server or cluster (``store.uri``: ``http://host:19530``; the token, when it needs one, from
the ``MILVUS_TOKEN`` environment variable, never from params.yaml).

A collection per space (``<store collection>_<storage>``, ``storage`` drawn once per space: ``s1``,
``s2`` …; its description names the space) holds one row per item slot: ``slot`` (the primary key,
so writing a slot again is an idempotent upsert: a resumed chunk rewrites the same rows),
``vector``, its provenance: ``space``, ``model_ref`` (the model version that produced it),
``checksum`` and ``source_hash`` (of the content it was made from), and ``item_id``; and the write
that made it authoritative (``wb``, ``wc``: backfill and chunk, 0 for an ingest) and the one that
moved its item out of the space (``mb``, ``mc``), which search filters on (``modelupgrade.store.
parts``). A new space is a new collection, as a model change in Milvus is done; the old one stays
until it is dropped. A cutover points the alias ``<store collection>__serving``, what clients
outside modelupgrade search, at the new space's collection; a rollback points it back.

Search runs Milvus's own search in each part of a snapshot, restricted to the part's slots by a
filter (the part's slots, or the other items' slots, whichever list is shorter), for a few more
than k candidates per query; the store ranks the candidates with the shared kernel, so with a FLAT
index the answers are the embedded store's (ties at the k-th distance aside). ``store.index``
chooses each collection's index when its space is added: FLAT, HNSW (M, efConstruction; ef per
search) or IVF_FLAT (nlist; nprobe per search). Milvus keeps it up to date as rows are upserted and
applies the filter inside the index search, so a backfill needs nothing more.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.retrieval.distance import Distance
from modelupgrade.store.backends.base import (
    VECTOR_BACKENDS,
    BackendSettings,
    PartGallery,
    VectorBackend,
    VectorRows,
    uri_credentials,
    without_credentials,
)
from modelupgrade.store.backends.milvus_client import (
    PREFIX_ENV,
    TOKEN_ENV,
    is_server_uri,
    load_collection,
    milvus_address,
    open_client,
    release_lite,
    without_userinfo,
)
from modelupgrade.store.backends.milvus_schema import (
    MODEL_REF_LENGTH,
    STATE_FIELDS,
    collection_part,
    create_space_collection,
    create_state_collection,
    kept_id,
)
from modelupgrade.store.backends.milvus_search import (
    INDEX_TYPES,
    MAX_TOPK,
    SearchedPart,
    search_params,
)
from modelupgrade.store.spaces import SpaceSpec

_METRICS: dict[str, str] = {"cosine": "COSINE", "l2": "L2"}
# Slots per request: well under Milvus's 64 MB message and 16,384-row result limits.
_BATCH = 4096
_LOADED = "Loaded"  # str() of pymilvus's LoadState.Loaded


def _batches(slots: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, len(slots), _BATCH):
        yield slots[start : start + _BATCH]


def _listed(slots: np.ndarray) -> str:
    """Slots as a filter expression's list (Milvus Lite takes no filter parameters)."""
    return "[" + ",".join(map(str, np.asarray(slots, dtype=np.int64).tolist())) + "]"


@VECTOR_BACKENDS.register("milvus")
class MilvusVectors(VectorBackend):
    def __init__(self, store_path: Path, settings: BackendSettings) -> None:
        super().__init__(store_path, settings)
        # The newest Milvus timestamp of a write of this process, and of any write the store's
        # database has recorded (``fence``, set by the store): what a read must see.
        self._written = 0
        self.fence: Callable[[], int] = lambda: 0
        # A store written before credentials were refused in its URI: they serve as its token.
        self._uri_token = uri_credentials(settings.uri) or ""
        self.uri = milvus_address(store_path, without_userinfo(settings.uri))
        # A server's other readers (replicas, clients of the collections) read the serving state.
        self.publishes = is_server_uri(self.uri)
        self.metric = _METRICS[settings.distance]
        self._client: Any = None
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def prepared(cls, store_path: Path, settings: BackendSettings) -> BackendSettings:
        if uri_credentials(settings.uri) is not None:
            raise UserError(
                f"store.uri {without_credentials(settings.uri)!r} carries credentials; the store "
                "records its URI, so they would be written into it",
                hint=f"give the URI without user:password@ and put them in ${TOKEN_ENV} "
                "(user:password, or an API key)",
            )
        milvus_address(store_path, settings.uri)  # a bad URI is an error before the store exists
        uri = settings.uri
        if uri and not is_server_uri(uri):
            uri = str(Path(uri).resolve())  # a Lite file named relative to where the store began
        prefix = os.environ.get(PREFIX_ENV) or "modelupgrade_"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,200}", prefix):
            raise UserError(
                f"${PREFIX_ENV} {prefix!r} cannot begin a Milvus collection name",
                hint="use letters, digits and '_', starting with a letter or '_'",
            )
        collection = settings.collection or f"{prefix}{uuid.uuid4().hex[:12]}"
        return dataclasses.replace(settings, uri=uri, collection=collection)

    # ----- connection ---------------------------------------------------------------------------
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> Any:
        token = os.environ.get(TOKEN_ENV, "") or self._uri_token
        return open_client(self.uri, token, self.store_path)

    def reachable(self) -> None:
        self.client().list_collections()  # a round trip: a cached client may have lost its server

    def collection(self, spec: SpaceSpec) -> str:
        return self._collection_of(spec.storage)

    def _collection_of(self, storage: str) -> str:
        return f"{self.settings.collection}_{collection_part(storage)}"

    def storage_for(self, spec: SpaceSpec, draw: Callable[[], int]) -> str:
        """``s<n>``: a collection name of fixed form whatever the space is called (a 128-character
        space name would make one Milvus refuses), and a new one for a space created again."""
        return f"s{draw()}"

    def _ensure(self, spec: SpaceSpec) -> str:
        """The collection of ``spec``, checked once against the space."""
        name = self.collection(spec)
        if self._known.get(name) == spec.dim:
            return name
        client = self.client()
        if not client.has_collection(name):
            raise UserError(
                f"Milvus at {without_credentials(self.uri)} has no collection {name} for space "
                f"{spec.name!r} of store {self.store_path}",
                hint="the store and its Milvus collections were separated; point store.uri at "
                "the Milvus that holds them, or rebuild the store",
            )
        fields = {field["name"]: field for field in client.describe_collection(name)["fields"]}
        if not set(STATE_FIELDS) <= set(fields):
            raise UserError(
                f"Milvus collection {name} of space {spec.name!r} was written by an earlier "
                "modelupgrade: its rows carry no state fields, which search filters on",
                hint="rebuild the store with this version (`modelupgrade store-ingest` of its "
                "items into a new store)",
            )
        dim = int(fields["vector"]["params"]["dim"])
        if dim != spec.dim:
            raise UserError(
                f"Milvus collection {name} holds {dim}-d vectors, but space {spec.name!r} is "
                f"{spec.dim}-d",
                hint="the collection belongs to another store or model; rebuild the store",
            )
        if str(client.get_load_state(name)["state"]) != _LOADED:
            load_collection(client, self.uri, name)  # a reopened Lite file starts with none loaded
        self._known[name] = dim
        return name

    # ----- spaces and rows ----------------------------------------------------------------------
    def add_space(self, spec: SpaceSpec, rows: int) -> None:
        if len(spec.model_ref) > MODEL_REF_LENGTH:
            raise UserError(
                f"the model reference of space {spec.name!r} is {len(spec.model_ref)} characters "
                f"long; Milvus records at most {MODEL_REF_LENGTH}",
                hint="name the model by a shorter path or registry version",
            )
        client = self.client()
        name = self.collection(spec)
        if not client.has_collection(name):
            create_space_collection(client, name, spec, self.settings.index, self.metric)
        self._ensure(spec)

    def reserve(self, specs: list[SpaceSpec], rows: int) -> None:
        """Nothing to do: a collection takes any slot."""

    def write(self, spec: SpaceSpec, rows: VectorRows) -> None:
        self._upsert(spec, rows, (0, 0))

    def _wrote(self, collection: str) -> None:
        """Note the Milvus timestamp of this process's last write to ``collection``."""
        if not is_server_uri(self.uri):
            return
        from pymilvus.client import ts_utils

        address = self.client()._get_connection().server_address
        self._written = max(
            self._written, int(ts_utils.get_collection_ts(collection, address, "") or 0)
        )

    def write_mark(self) -> int:
        return self._written

    def _consistency(self) -> dict[str, Any]:
        """How a read waits for writes (a server; Milvus Lite reads what is written): for every
        write the store's database records, and this process's own, and no longer (a Strong read
        would wait for the server's next time tick, up to 200 ms, on every call)."""
        if not is_server_uri(self.uri):
            return {}
        fence = max(self.fence(), self._written)
        if not fence:
            return {"consistency_level": "Strong"}
        return {"consistency_level": "Customized", "guarantee_timestamp": fence}

    def _upsert(self, spec: SpaceSpec, rows: VectorRows, moved_by: tuple[int, int]) -> None:
        name = self._ensure(spec)
        signed = np.asarray(rows.checksums, dtype=np.uint64).view(np.int64)
        sources = np.asarray(rows.sources, dtype=np.uint64).view(np.int64)
        ids = rows.item_ids or ("",) * len(rows)
        written_batch, written_chunk = rows.written_by
        moved_batch, moved_chunk = moved_by
        client = self.client()
        for start in range(0, len(rows), _BATCH):
            end = start + _BATCH
            client.upsert(
                name,
                [
                    {
                        "slot": int(slot),
                        "vector": vector,
                        "space": spec.name,
                        "model_ref": spec.model_ref,
                        "checksum": int(checksum),
                        "source_hash": int(source),
                        "item_id": kept_id(item_id),
                        "wb": written_batch,
                        "wc": written_chunk,
                        "mb": moved_batch,
                        "mc": moved_chunk,
                    }
                    for slot, vector, checksum, source, item_id in zip(
                        rows.slots[start:end],
                        rows.vectors[start:end],
                        signed[start:end],
                        sources[start:end],
                        ids[start:end],
                        strict=True,
                    )
                ],
            )
        self._wrote(name)

    def sync(self, spec: SpaceSpec) -> None:
        """Milvus Lite: flush the rows from its write-ahead log (written through to the OS only)
        into segment files, which it syncs to disk, and which its searches scan far faster. A
        server's acknowledged upsert is already durable in its log, and a flush per chunk would
        only strain it."""
        if not is_server_uri(self.uri):
            self.client().flush(self._ensure(spec))

    def _rows(self, spec: SpaceSpec, slots: np.ndarray, field: str) -> dict[int, Any]:
        name = self._ensure(spec)
        found: dict[int, Any] = {}
        for batch in _batches(np.asarray(slots, dtype=np.int64)):
            for row in self.client().query(
                name,
                filter=f"slot in {_listed(batch)}",
                output_fields=["slot", field],
                **self._consistency(),
            ):
                found[int(row["slot"])] = row[field]
        missing = [int(s) for s in slots if int(s) not in found]
        if missing:
            raise UserError(
                f"Milvus collection {name} has no vector for {len(missing)} slot(s) of space "
                f"{spec.name!r}, e.g. slot {missing[0]}",
                hint="the store's Milvus collections were changed outside modelupgrade; rebuild "
                "the store",
            )
        return found

    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        found = self._rows(spec, slots, "vector")
        rows = np.empty((len(slots), spec.dim), dtype=np.float32)
        for row, slot in enumerate(slots):
            rows[row] = found[int(slot)]
        return rows

    def checksums(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        found = self._rows(spec, slots, "checksum")
        signed = np.array([found[int(slot)] for slot in slots], dtype=np.int64)
        return signed.view(np.uint64)

    def sources(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        found = self._rows(spec, slots, "source_hash")
        signed = np.array([found[int(slot)] for slot in slots], dtype=np.int64)
        return signed.view(np.uint64)

    def destroy(self, specs: list[SpaceSpec], slots: np.ndarray) -> None:
        """Delete the rows of ``slots`` in every space's collection, then have Milvus compact
        them away (a delete alone only hides a row until its segment is compacted)."""
        client = self.client()
        for spec in specs:
            name = self._present(spec)
            if name is None:
                continue
            for batch in _batches(np.asarray(slots, dtype=np.int64)):
                client.delete(name, filter=f"slot in {_listed(batch)}")
            self._wrote(name)
            self._settle(name)

    def present_slots(self, spec: SpaceSpec) -> np.ndarray:
        """Every slot ``spec``'s collection holds a row for (read in slot ranges: constant-size
        requests)."""
        name, client = self._ensure(spec), self.client()
        found: list[int] = []
        start = 0
        while True:
            rows = client.query(
                name,
                filter=f"slot >= {start} and slot < {start + _BATCH}",
                output_fields=["slot"],
                **self._consistency(),
            )
            found += [int(row["slot"]) for row in rows]
            more = client.query(
                name, filter=f"slot >= {start + _BATCH}", output_fields=["count(*)"]
            )
            if not more or not int(more[0]["count(*)"]):
                return np.array(sorted(found), dtype=np.int64)
            start += _BATCH

    def discard_beyond(self, specs: list[SpaceSpec], rows: int) -> int:
        client, removed = self.client(), 0
        for spec in specs:
            name = self._present(spec)
            if name is None:
                continue
            found = client.query(
                name,
                filter=f"slot >= {int(rows)}",
                output_fields=["count(*)"],
                **self._consistency(),
            )
            count = int(found[0]["count(*)"]) if found else 0
            if count:
                client.delete(name, filter=f"slot >= {int(rows)}")
                self._wrote(name)
                self._settle(name)
            removed = max(removed, count)
        return removed

    def _present(self, spec: SpaceSpec) -> str | None:
        """The collection of ``spec``, loaded, when Milvus holds one (None: it was dropped)."""
        if not self.client().has_collection(self.collection(spec)):
            return None
        return self._ensure(spec)

    def _settle(self, name: str) -> None:
        """Make deletions durable and physical: flush, then compact (where Milvus compacts)."""
        client = self.client()
        client.flush(name)
        if is_server_uri(self.uri):
            client.compact(name)

    def index_settled(self, spec: SpaceSpec, timeout_s: float = 30.0) -> bool:
        client, name = self.client(), self._ensure(spec)
        deadline = time.monotonic() + timeout_s
        while True:
            states = [client.describe_index(name, index) for index in client.list_indexes(name)]
            if all(
                state.get("pending_index_rows", 0) == 0
                and state.get("state", "Finished") == "Finished"
                for state in states
            ):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def provenance(self, spec: SpaceSpec, slots: np.ndarray) -> list[tuple[str, str]]:
        """The (space, model_ref) recorded with each vector of ``slots``."""
        name = self._ensure(spec)
        found: dict[int, tuple[str, str]] = {}
        for batch in _batches(np.asarray(slots, dtype=np.int64)):
            for row in self.client().query(
                name,
                filter=f"slot in {_listed(batch)}",
                output_fields=["slot", "space", "model_ref"],
                **self._consistency(),
            ):
                found[int(row["slot"])] = (row["space"], row["model_ref"])
        return [found.get(int(slot), ("", "")) for slot in slots]

    def part(self, spec: SpaceSpec, slots: np.ndarray, rows: str) -> PartGallery:
        self._ensure(spec)
        return SearchedPart(self, spec, slots, rows)

    def mark_moved(self, spec: SpaceSpec, slots: np.ndarray, by: tuple[int, int]) -> None:
        """Record in the rows of ``slots`` of ``spec`` (a backfill's source) that chunk ``by``
        (backfill, chunk) moves their items out: each row written again as it is, ``mb``/``mc``
        set. Done before the chunk commits; until then the frontier keeps it from counting."""
        name = self._ensure(spec)
        fields = ["slot", "vector", "checksum", "source_hash", "item_id", "wb", "wc"]
        client = self.client()
        for batch in _batches(np.asarray(slots, dtype=np.int64)):
            found = client.query(
                name,
                filter=f"slot in {_listed(batch)}",
                output_fields=fields,
                **self._consistency(),
            )
            rows = [
                {
                    **{field: row[field] for field in fields},
                    "space": spec.name,
                    "model_ref": spec.model_ref,
                    "mb": by[0],
                    "mc": by[1],
                }
                for row in found
            ]
            if rows:
                client.upsert(name, rows)
        self._wrote(name)
        # Milvus Lite searches the rows it has not flushed through its memtable, which turns each
        # into a Python list on every search: a backfill's rewritten source rows would pile up
        # there chunk after chunk (75 % of a half-way search, profiled). Flushed, they join a
        # segment, as the chunk's new rows do when the job syncs its target space.
        self.sync(spec)

    def search(
        self,
        spec: SpaceSpec,
        queries: np.ndarray,
        limit: int,
        distance: Distance,
        filter: str,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The union over ``queries`` of their ``limit`` nearest rows passing ``filter``."""
        if _METRICS[distance] != self.metric:
            raise UserError(
                f"the store's Milvus index ranks by {self.settings.distance} distance, the "
                f"search asks for {distance}",
                hint=f"search with distance {self.settings.distance} (store.distance), or "
                "rebuild the store with the other one",
            )
        name = self._ensure(spec)
        found: dict[int, Any] = {}
        searched_with = search_params(self.settings.index, limit)
        for start in range(0, len(queries), MAX_TOPK):
            results = self.client().search(
                name,
                data=[row for row in np.asarray(queries[start : start + MAX_TOPK], np.float32)],
                anns_field="vector",
                limit=limit,
                filter=filter,
                search_params={"metric_type": self.metric, "params": searched_with},
                output_fields=["vector"],
                **self._consistency(),
            )
            for hits in results:
                for hit in hits:
                    found[int(hit.id)] = hit["entity"]["vector"]
        slots = np.array(sorted(found), dtype=np.int64)
        vectors = np.array([found[int(s)] for s in slots], dtype=np.float32).reshape(-1, spec.dim)
        return slots, vectors

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.registry_name,
            "uri": without_credentials(self.uri),
            "collections": f"{self.settings.collection}_<storage>",
            "metric": self.metric,
            "index": INDEX_TYPES[self.settings.index.kind],
        }

    def stored(self) -> dict[str, str]:
        client, prefix = self.client(), f"{self.settings.collection}_"
        found = {}
        for name in client.list_collections():
            if name.startswith(prefix) and not name.startswith(prefix + "_"):
                described = client.describe_collection(name)
                found[name.removeprefix(prefix)] = str(described.get("description", ""))
        return found

    def discard(self, storage: str) -> None:
        name = self._collection_of(storage)
        self._known.pop(name, None)
        client = self.client()
        if client.has_collection(name):
            if self.serving_collection() == name:
                # Never drop what the serving alias points at: outside readers would lose it.
                raise UserError(
                    f"Milvus collection {name} is what the serving alias {self.alias} points "
                    "at; it is not dropped",
                    hint="`modelupgrade store-verify` compares the alias with the store's record",
                )
            client.drop_collection(name)

    @property
    def state_collection(self) -> str:
        """Where the store's serving state is kept for readers of the server alone (a row of
        JSON, ``snapshots.serving_state``): two underscores, as the alias."""
        return f"{self.settings.collection}__state"

    def known_storages(self) -> set[str]:
        prefix = f"{self.settings.collection}_"
        return {
            name.removeprefix(prefix)
            for name in self.client().list_collections()
            if name.startswith(prefix) and not name.startswith(prefix + "_")
        }

    def publish(self, state: JsonObject) -> None:
        import json

        client, name = self.client(), self.state_collection
        if not client.has_collection(name):
            create_state_collection(client, name)
        client.upsert(name, [{"key": 0, "state": json.dumps(state), "vector": [0.0, 0.0]}])

    def serving_state(self) -> JsonObject | None:
        """The serving state the store published last (None before any)."""
        import json

        client, name = self.client(), self.state_collection
        if not client.has_collection(name):
            return None
        rows = client.query(name, filter="key == 0", output_fields=["state"], **self._consistency())
        return json.loads(rows[0]["state"]) if rows else None

    @property
    def alias(self) -> str:
        """The alias a client outside modelupgrade searches: the serving space's collection. Two
        underscores: a space's collection part starts with a letter or digit, so no collection
        takes this name."""
        return f"{self.settings.collection}__serving"

    def serve(self, spec: SpaceSpec) -> str:
        name = self._ensure(spec)
        client = self.client()
        if self.alias in client.list_aliases()["aliases"]:
            client.alter_alias(name, self.alias)
        else:
            client.create_alias(name, self.alias)
        return f"alias {self.alias} -> {name}"

    def serving_collection(self) -> str | None:
        """The collection the alias points at (None before the first cutover)."""
        client = self.client()
        if self.alias not in client.list_aliases()["aliases"]:
            return None
        return str(client.describe_alias(self.alias)["collection_name"])

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
                if not is_server_uri(self.uri):
                    release_lite(self.uri)
            self._known.clear()
