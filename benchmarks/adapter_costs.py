"""What the training-free adapters cost: microseconds per query and fitting time against the sample.

    python -m benchmarks.adapter_costs [--dims 64 128] [--samples 1000 4000 16000] [--repeats 5]

For each adapter kind (``modelupgrade.heads``: Procrustes, low-rank affine at rank 32, residual MLP
at its defaults, SLERP at α 0.5 and with α tuned on a support split, Local Drift-Adapters'
per-cluster Procrustes and affine maps (K = 8, soft routing), query drift compensation with its
default 4,096 anchors; old and new dimension equal, d) it prints:

* the cost of mapping one query, in µs: the folded head (``inference_copy``, what ``FrozenHead``
  runs) on a torch tensor of batch 1 and per query of batch 1024, and at batch 1 end to end through
  ``FrozenHead.outputs`` from a numpy row (what a serving process pays per query);
* the time to fit it on n synthetic pairs (new = tanh(old·R) + noise, R a random rotation) through
  ``fit_head``, the pipeline's fitting path: closed form for Procrustes, affine and SLERP (the
  tuned one searching its α grid on a fifth of the pairs), k-means and a closed form per cluster
  for the local adapters, the anchors' drifts for query drift compensation, the Procrustes map
  plus 20 epochs of the MLP for the residual MLP.

Every figure is the median over ``--repeats`` repeats (each repeat of a per-query figure loops
until 0.1 s have passed), as the other benchmark scripts measure. The query-side and gallery-side
variants of one method cost the same at equal dimensions; the table shows the query side.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import torch

from benchmarks.adapter_throughput import best_seconds
from modelupgrade.config.heads import HeadParams
from modelupgrade.heads import EmbeddingPairs, FrozenHead, build_head, fit_head, inference_copy
from modelupgrade.heads.training import resolve_training

# (label, head kind, options): the query-side kinds, one per method.
ADAPTERS = (
    ("Procrustes", "procrustes_query", {}),
    ("low-rank affine (r 32)", "affine_query", {"rank": 32}),
    ("residual MLP", "residual_mlp_query", {}),
    ("SLERP (α 0.5)", "slerp_query", {"weight": 0.5}),
    ("SLERP (α tuned)", "slerp_query", {}),
    ("local Procrustes (K 8)", "local_procrustes_query", {}),
    ("local affine (K 8, r 32)", "local_affine_query", {"rank": 32}),
    ("query drift comp. (4,096)", "qdc_query", {}),
)
CPU = torch.device("cpu")


def synthetic_pairs(count: int, dim: int, seed: int = 0) -> EmbeddingPairs:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    old = rng.standard_normal((count, dim)).astype(np.float32)
    new = np.tanh(old @ rotation) + 0.1 * rng.standard_normal((count, dim))
    return EmbeddingPairs(old, new.astype(np.float32), np.zeros(count, dtype=np.int64))


def fit(kind: str, options: dict, data: EmbeddingPairs):  # type: ignore[no-untyped-def]
    entry = HeadParams(kind=kind, options=options)
    training = resolve_training(entry)
    dim = data.old.shape[1]
    head = build_head(kind, dim, dim, training.hidden_dim, training.depth, options=options)
    fit_head(head, data, training, device=CPU, seed=0)
    return head


def per_query_costs(head, dim: int, repeats: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """µs per query: the folded module at batch 1 and 1024, and FrozenHead from numpy at batch 1."""
    frozen = inference_copy(head)
    rng = np.random.default_rng(1)
    single = rng.standard_normal((1, dim)).astype(np.float32)
    batch = rng.standard_normal((1024, dim)).astype(np.float32)
    # SLERP also reads the old model's embedding of each query.
    side: dict[int, torch.Tensor | None] = {1: None, 1024: None}
    if head.takes_old_embedding:
        side = {
            size: torch.from_numpy(rng.standard_normal((size, dim)).astype(np.float32))
            for size in (1, 1024)
        }
    costs = {}
    with torch.inference_mode():
        for size, rows in ((1, single), (1024, batch)):
            run = functools.partial(frozen.outputs, torch.from_numpy(rows), side[size])
            costs[f"module_b{size}"] = best_seconds(run, CPU, repeats, 0.1) / size * 1e6
    serving = FrozenHead(head, CPU)
    numpy_side = None if side[1] is None else side[1].numpy()
    run_numpy = functools.partial(serving.outputs, single, numpy_side)
    seconds = best_seconds(run_numpy, CPU, repeats, 0.1)
    costs["numpy_b1"] = seconds * 1e6
    return costs


def fit_seconds(kind: str, options: dict, data: EmbeddingPairs, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        fit(kind, options, data)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128], help="dimension d")
    parser.add_argument(
        "--samples", type=int, nargs="+", default=[1000, 4000, 16000], help="pairs fitted on"
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats per figure (median)")
    parser.add_argument(
        "--fit-repeats", type=int, default=3, help="repeats per fitting time (median)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"training-free adapters, d -> d, cpu ({torch.get_num_threads()} threads), "
        f"torch {torch.__version__}; median of {args.repeats} (cost) / {args.fit_repeats} (fit)"
    )
    print()
    print("cost per query (µs)")
    header = (
        f"{'adapter':<26} {'d':>4} {'MACs':>10} {'batch 1':>9} {'batch 1024':>11} "
        f"{'batch 1, numpy':>15}"
    )
    print(header)
    print("-" * len(header))
    for dim in args.dims:
        data = synthetic_pairs(5000, dim)
        for label, kind, options in ADAPTERS:
            head = fit(kind, options, data)
            costs = per_query_costs(head, dim, args.repeats)
            macs = head.macs_per_embedding()["transform"]
            print(
                f"{label:<26} {dim:>4} {macs:>10,d} {costs['module_b1']:>9.2f} "
                f"{costs['module_b1024']:>11.3f} {costs['numpy_b1']:>15.2f}"
            )
    print()
    print("fitting time (s) against the sample size")
    sizes = "".join(f"{f'n = {n:,}':>12}" for n in args.samples)
    header = f"{'adapter':<26} {'d':>4}{sizes}"
    print(header)
    print("-" * len(header))
    for dim in args.dims:
        samples = {n: synthetic_pairs(n, dim, seed=n) for n in args.samples}
        for label, kind, options in ADAPTERS:
            cells = "".join(
                f"{fit_seconds(kind, options, samples[n], args.fit_repeats):>12.4f}"
                for n in args.samples
            )
            print(f"{label:<26} {dim:>4}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
