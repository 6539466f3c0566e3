"""Query × gallery pairs scored per second for top-100 retrieval, FAISS vs dense matmul + topk.

    python -m benchmarks.eval_throughput [--gallery 10000 100000] [--queries 2000] [--dim 128]

For each gallery size N, in one run: the project's ``GallerySearcher`` (FAISS exact IndexFlatIP,
blocked), a plain torch matmul + ``torch.topk`` over the same normalised vectors, and the exact
full-ranking mAP engine (``rank_features``). Prints wall time and pairs/s; ratios are measured here.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from modelupgrade.metrics import rank_features
from modelupgrade.retrieval.index import GallerySearcher, SearchOptions, torch_knn


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gallery", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument(
        "--no-full-map", action="store_true", help="skip the full-ranking mAP engine"
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(
        f"torch threads {torch.get_num_threads()}, queries {args.queries}, dim {args.dim}, "
        f"k {args.k}"
    )
    for n in args.gallery:
        gallery = rng.standard_normal((n, args.dim)).astype(np.float32)
        queries = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
        pairs = n * args.queries
        searcher, build = _timed(GallerySearcher, gallery, SearchOptions(use_gpu="auto"))
        (_, ids), faiss_s = _timed(searcher.search, queries, args.k)
        (_, ref), torch_s = _timed(torch_knn, queries, gallery, args.k, query_block=1024)
        agree = float((ids == ref).mean())
        print(
            f"N={n:>7}: faiss flat  {faiss_s:7.3f} s  {pairs / faiss_s:12.3e} pairs/s "
            f"(build {build:.3f} s)"
        )
        print(
            f"N={n:>7}: matmul+topk {torch_s:7.3f} s  {pairs / torch_s:12.3e} pairs/s  "
            f"faiss/matmul speed ratio {torch_s / faiss_s:.2f}, same ids {agree:.4f}"
        )
        if not args.no_full_map:
            labels_g = rng.integers(0, 100, n)
            labels_q = rng.integers(0, 100, args.queries)
            _, full_s = _timed(rank_features, queries, gallery, labels_q, labels_g)
            print(f"N={n:>7}: full-ranking mAP {full_s:7.3f} s  {pairs / full_s:12.3e} pairs/s")


if __name__ == "__main__":
    main()
