"""Nearest-neighbour search over a gallery with FAISS, in bounded memory.

Vectors are L2-normalised float32 and scored by inner product (= cosine), or, with
``metric="l2"``, scored by squared L2 distance as they are. The default index is the exact flat
one; ``ivf`` and ``hnsw`` trade exactness for speed on large galleries. One class per index kind,
registered in ``INDEXES``. A search may be restricted to some of an index's rows (``allowed``): the
gallery store keeps one index per embedding space and searches the part of it a snapshot holds.
A GPU copy of the index is used when the installed FAISS has GPU support and a GPU is visible
(``use_gpu="auto"``).

Queries are searched in blocks of ``query_block`` rows, and a gallery larger than ``gallery_block``
rows is split into shards whose top-k lists are merged, so neither the score tile nor the index
exceeds a fixed size. ``torch_knn`` is the brute-force reference the exact index is tested against.

Where FAISS is not installed (a lent GPU machine: see ``modelupgrade.gpu_study``), the exact
``flat`` index is ``TorchFlatIndex``: the same scores and top-k by torch matrix products, on the
GPU when one is visible. The approximate indexes need FAISS.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from modelupgrade.arrays import vector_rows
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.plugins import Registry

log = logging.getLogger(__name__)

GpuUse = Literal["auto", "never", "always"]
INDEXES: Registry = Registry("search index")


def _faiss() -> Any:
    if not faiss_installed():
        raise UserError(
            "FAISS is not installed",
            hint="pip install faiss-cpu (or faiss-gpu); the exact 'flat' index runs without it",
        )
    import faiss

    return faiss


@functools.cache
def faiss_installed() -> bool:
    return importlib.util.find_spec("faiss") is not None


def faiss_gpu_available() -> bool:
    """True when the installed FAISS build has GPU support and sees at least one GPU."""
    if not faiss_installed():
        return False
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def normalised_float32(vectors: np.ndarray, what: str = "vectors") -> np.ndarray:
    """A C-contiguous float32 copy with unit-L2 rows (zero rows stay zero)."""
    array = np.array(vector_rows(vectors, what), copy=True)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    np.divide(array, np.maximum(norms, 1e-12), out=array)
    return array


@dataclass(frozen=True)
class SearchOptions:
    """How to build and query an index; the fields mirror ``evaluation.search`` in params.yaml."""

    index: str = "flat"
    use_gpu: GpuUse = "auto"
    query_block: int = 4096
    gallery_block: int = 1_000_000
    ivf_nlist: int = 1024
    ivf_nprobe: int = 32
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    # "ip": inner product of unit vectors (cosine); "l2": squared L2 distance
    metric: Literal["ip", "l2"] = "ip"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Any) -> SearchOptions:
        return cls(
            **{
                k: getattr(params, k)
                for k in cls.__dataclass_fields__
                if k != "extra" and hasattr(params, k)
            }
        )


class SearchIndex(ABC):
    """An index over one shard of unit-norm float32 gallery vectors; ids are row numbers."""

    registry_name: ClassVar[str]
    exact: ClassVar[bool]

    def __init__(self, dim: int, options: SearchOptions) -> None:
        self.dim = dim
        self.options = options
        self.index = self.build(dim)
        self.on_gpu = False

    @abstractmethod
    def build(self, dim: int) -> Any:
        """The empty FAISS index."""

    def add(self, vectors: np.ndarray) -> None:
        if not self.index.is_trained:
            self.index.train(vectors)
        self.index.add(vectors)
        self.configure_search()

    def configure_search(self) -> None:
        """Search-time parameters (nprobe, efSearch)."""

    @property
    def metric(self) -> int:
        faiss = _faiss()
        return faiss.METRIC_L2 if self.options.metric == "l2" else faiss.METRIC_INNER_PRODUCT

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def search_parameters(self, k: int, selector: Any) -> Any:
        """FAISS search parameters restricted to ``selector``'s rows."""
        return _faiss().SearchParameters(sel=selector)

    def to_gpu(self) -> None:
        faiss = _faiss()
        self._gpu_resources = faiss.StandardGpuResources()
        self.index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self.index)
        self.on_gpu = True

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids) of the ``k`` best rows per query; with ``allowed`` (a bool per row)
        only among those rows, filtered while searching (ids −1 pad short lists)."""
        if allowed is None:
            scores, ids = self.index.search(queries, k)
            return scores, ids
        faiss = _faiss()
        bits = np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")
        selector = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))
        scores, ids = self.index.search(queries, k, params=self.search_parameters(k, selector))
        return scores, ids


@INDEXES.register("flat")
class FlatIndex(SearchIndex):
    """Exact inner-product search (brute force, BLAS-tiled by FAISS)."""

    exact = True

    def build(self, dim: int) -> Any:
        faiss = _faiss()
        return faiss.IndexFlatL2(dim) if self.options.metric == "l2" else faiss.IndexFlatIP(dim)


@INDEXES.register("ivf")
class IVFIndex(SearchIndex):
    """Inverted lists over k-means cells; ``ivf_nprobe`` cells are scanned per query."""

    exact = False

    def build(self, dim: int) -> Any:
        faiss = _faiss()
        l2 = self.options.metric == "l2"
        self._quantizer = faiss.IndexFlatL2(dim) if l2 else faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(self._quantizer, dim, self.options.ivf_nlist, self.metric)

    def add(self, vectors: np.ndarray) -> None:
        if len(vectors) < self.options.ivf_nlist:
            raise UserError(
                f"an IVF index with {self.options.ivf_nlist} cells needs at least that many "
                f"gallery vectors to train, got {len(vectors)}",
                hint="lower evaluation.search.ivf_nlist or use the exact 'flat' index",
            )
        super().add(vectors)

    def configure_search(self) -> None:
        self.index.nprobe = min(self.options.ivf_nprobe, self.options.ivf_nlist)

    def search_parameters(self, k: int, selector: Any) -> Any:
        return _faiss().SearchParametersIVF(sel=selector, nprobe=self.index.nprobe)


@INDEXES.register("hnsw")
class HNSWIndex(SearchIndex):
    """Hierarchical navigable small-world graph (CPU only in FAISS)."""

    exact = False

    def build(self, dim: int) -> Any:
        faiss = _faiss()
        index = faiss.IndexHNSWFlat(dim, self.options.hnsw_m, self.metric)
        index.hnsw.efSearch = self.options.hnsw_ef_search
        index.hnsw.efConstruction = self.options.hnsw_ef_construction
        return index

    def configure_search(self) -> None:
        self.index.hnsw.efSearch = self.options.hnsw_ef_search

    def search_parameters(self, k: int, selector: Any) -> Any:
        # the candidate list must hold the k asked for, or HNSW returns fewer
        return _faiss().SearchParametersHNSW(
            sel=selector, efSearch=max(self.options.hnsw_ef_search, k)
        )

    def to_gpu(self) -> None:
        log.info("FAISS has no GPU HNSW; the hnsw index stays on the CPU")


class TorchFlatIndex(SearchIndex):
    """Exact search without FAISS: the flat index's scores (inner product, or squared L2 distance)
    and top-k by torch, in score tiles of at most ``TILE_ELEMENTS``, on the GPU after
    ``to_gpu``. What ``GallerySearcher`` uses for ``flat`` where FAISS is not installed."""

    registry_name = "flat"
    exact = True
    TILE_ELEMENTS = 1 << 24

    def build(self, dim: int) -> torch.Tensor:
        return torch.empty(0, dim)

    def add(self, vectors: np.ndarray) -> None:
        added = torch.as_tensor(np.ascontiguousarray(vectors, dtype=np.float32))
        self.index = torch.cat([self.index, added.to(self.index.device)])

    @property
    def size(self) -> int:
        return len(self.index)

    def to_gpu(self) -> None:
        self.index = self.index.to("cuda")
        self.on_gpu = True

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        gallery = self.index
        l2 = self.options.metric == "l2"
        mask = None if allowed is None else torch.as_tensor(np.asarray(allowed, dtype=bool))
        if mask is not None:
            mask = mask.to(gallery.device)
        width = min(k, len(gallery))
        rows = max(1, self.TILE_ELEMENTS // max(1, len(gallery)))
        scores_out = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids_out = np.full((len(queries), k), -1, dtype=np.int64)
        for start in range(0, len(queries), rows):
            block = torch.as_tensor(queries[start : start + rows]).to(gallery.device)
            scores = block @ gallery.T
            if l2:
                # Squared distances, smallest first: top-k of their negation.
                scores = (
                    2 * scores - (block * block).sum(1, keepdim=True) - (gallery * gallery).sum(1)
                )
            if mask is not None:
                scores[:, ~mask] = -torch.inf
            top = torch.topk(scores, width, dim=1)
            values, ids = top.values.cpu().numpy(), top.indices.cpu().numpy()
            ids[~np.isfinite(values)] = -1
            end = start + len(block)
            scores_out[start:end, :width] = -values if l2 else values
            ids_out[start:end, :width] = ids
        if l2:
            scores_out[ids_out < 0] = np.inf
        return scores_out, ids_out


def merge_topk(
    scores: list[np.ndarray], ids: list[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists (ids already global) into one top-k, best first."""
    all_scores = np.concatenate(scores, axis=1)
    all_ids = np.concatenate(ids, axis=1)
    # Missing results (id −1, score −inf/−FLT_MAX) sort last.
    all_scores = np.where(all_ids < 0, -np.inf, all_scores)
    order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(all_scores, order, 1), np.take_along_axis(all_ids, order, 1)


class GallerySearcher:
    """Builds one index per gallery shard and answers blocked top-k queries."""

    def __init__(self, gallery: np.ndarray, options: SearchOptions | None = None) -> None:
        self.options = options or SearchOptions()
        if self.options.query_block < 1 or self.options.gallery_block < 1:
            raise UserError("query_block and gallery_block must be ≥ 1")
        index_class = INDEXES.get(self.options.index)
        if index_class is FlatIndex and not faiss_installed():
            index_class = TorchFlatIndex
        self.engine = "torch" if index_class is TorchFlatIndex else "faiss"
        vectors = normalised_float32(gallery, "gallery vectors")
        self.size, self.dim = vectors.shape
        if self.size == 0:
            raise UserError("the gallery is empty", hint="check the gallery split file")
        self.use_gpu = self._resolve_gpu()
        self.shards: list[tuple[int, SearchIndex]] = []
        for start in range(0, self.size, self.options.gallery_block):
            shard = index_class(self.dim, self.options)
            shard.add(vectors[start : start + self.options.gallery_block])
            if self.use_gpu:
                shard.to_gpu()
            self.shards.append((start, shard))
        self.exact = index_class.exact

    def _resolve_gpu(self) -> bool:
        use = self.options.use_gpu
        if use == "never":
            return False
        available = faiss_gpu_available() or (
            not faiss_installed() and self.options.index == "flat" and torch.cuda.is_available()
        )
        if use == "always" and not available:
            raise UserError(
                "evaluation.search.use_gpu is 'always' but FAISS has no GPU support or sees no GPU",
                hint="install faiss-gpu on a machine with a CUDA GPU, or set use_gpu: auto",
            )
        return available

    def describe(self) -> JsonObject:
        return {
            "index": self.options.index,
            "engine": self.engine,
            "exact": self.exact,
            "gpu": self.use_gpu,
            "shards": len(self.shards),
            "gallery": self.size,
            "dim": self.dim,
        }

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the ``k`` best gallery rows per query, best first;
        ids −1 pad short lists."""
        if k < 1:
            raise UserError(f"k must be ≥ 1, got {k}")
        queries = normalised_float32(queries, "query vectors")
        if queries.shape[1] != self.dim:
            raise UserError(
                f"query vectors are {queries.shape[1]}-d but the gallery is {self.dim}-d",
                hint="search a gallery of the same embedding space (apply the "
                "transformation head first)",
            )
        k_shard = min(k, self.options.gallery_block)
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_ids = np.full((len(queries), k), -1, dtype=np.int64)
        for start in range(0, len(queries), self.options.query_block):
            block = queries[start : start + self.options.query_block]
            shard_scores, shard_ids = [], []
            for offset, shard in self.shards:
                s, i = shard.search(block, k_shard)
                shard_scores.append(s)
                shard_ids.append(np.where(i >= 0, i + offset, -1))
            s, i = (
                merge_topk(shard_scores, shard_ids, k)
                if len(self.shards) > 1
                else (shard_scores[0], shard_ids[0])
            )
            width = s.shape[1]
            out_scores[start : start + len(block), :width] = s
            out_ids[start : start + len(block), :width] = i
        return out_scores, out_ids


def exclude_self(
    ids: np.ndarray, scores: np.ndarray, query_ids: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Drop each query's own gallery row from a (k+1)-wide result list; keep ``k`` columns."""
    keep = ids != np.asarray(query_ids)[:, None]
    # Rows where self was not retrieved drop their last column instead.
    missing = keep.all(axis=1)
    keep[missing, -1] = False
    width = ids.shape[1] - 1
    ids = ids[keep].reshape(len(ids), width)[:, :k]
    scores = scores[keep].reshape(len(scores), width)[:, :k]
    return ids, scores


def torch_knn(
    queries: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    k: int,
    query_block: int = 1024,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force cosine top-k with a dense matmul and ``torch.topk`` (reference and baseline)."""
    device = torch.device(device)
    q = torch.as_tensor(normalised_float32(np.asarray(queries), "query vectors"))
    g = torch.as_tensor(normalised_float32(np.asarray(gallery), "gallery vectors")).to(device)
    k = min(k, len(g))
    out_scores, out_ids = [], []
    for start in range(0, len(q), query_block):
        scores = q[start : start + query_block].to(device) @ g.T
        values, indices = torch.topk(scores, k, dim=1)
        out_scores.append(values.cpu())
        out_ids.append(indices.cpu())
    return torch.cat(out_scores).numpy(), torch.cat(out_ids).numpy().astype(np.int64)
