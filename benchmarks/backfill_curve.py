"""Time a whole backfill curve against one single evaluation and against the naive per-point loop.

    python -m benchmarks.backfill_curve --n 20000 --steps 20 --per-class 50

Leave-one-out on synthetic clustered embeddings (old and new spaces, ``dim``-d). Prints, measured in
this one run: one single evaluation (one gallery state), the one-pass curve over B + 2 = K points,
and the naive loop (rebuild the gallery and evaluate it at each point); the ratios curve / single
(target ≤ 3) and naive / curve. ``--naive-points`` times the naive loop on fewer points and scales
it linearly (each naive point is one full evaluation, so the loop is linear in the points).
``--orders N`` also times N random orders over the same systems, as the study runs a policy's
draws and the policies of one serving mode: one ``backfill_curve`` per order against one
``backfill_curves`` call that ranks each query block once (``--naive-points -1`` skips the naive
loop).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from modelupgrade.backfill import (
    SearchSystems,
    backfill_curve,
    backfill_curves,
    evaluate_state,
    fastfill_grid,
    naive_curve,
    simulate_curve,
)


def synthetic(
    n: int, per_class: int, dim: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    classes = max(1, n // per_class)
    labels = rng.integers(0, classes, n)
    centres_old = rng.normal(size=(classes, dim)).astype(np.float32)
    centres_new = rng.normal(size=(classes, dim)).astype(np.float32)
    old = centres_old[labels] + 1.2 * rng.normal(size=(n, dim)).astype(np.float32)
    new = centres_new[labels] + 0.8 * rng.normal(size=(n, dim)).astype(np.float32)
    return old, new, labels


def timed(fn, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument(
        "--steps", type=int, default=20, help="FastFill's B: the curve has B + 2 points"
    )
    parser.add_argument("--per-class", type=int, default=50, help="gallery images per class")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--distance", choices=["l2", "cosine"], default="l2")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--naive-points",
        type=int,
        default=0,
        help="0 = time the naive loop on every point, -1 = skip it",
    )
    parser.add_argument(
        "--orders", type=int, default=1, help="also time this many orders, apart and shared"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = torch's default)"
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    old, new, labels = synthetic(args.n, args.per_class, args.dim, args.seed)
    ordering = np.random.default_rng(args.seed + 1).permutation(args.n)
    grid = fastfill_grid(args.steps, args.n)
    systems = SearchSystems(new, old, new, new)
    print(
        f"n = {args.n} leave-one-out, d = {args.dim}, {args.per_class} per class, K = {len(grid)} "
        f"points, {args.distance}, torch threads = {torch.get_num_threads()}"
    )

    single_s, _ = timed(lambda: evaluate_state(new, new, labels, True, args.distance), args.repeats)
    print(f"single evaluation (one gallery state):   {single_s:8.2f} s")
    curve_s, curve = timed(
        lambda: simulate_curve(old, new, new, labels, ordering, grid, distance=args.distance),
        args.repeats,
    )
    print(f"one-pass curve ({len(grid)} points):            {curve_s:8.2f} s")

    print(
        f"curve / single evaluation:               {curve_s / single_s:8.2f}   (target ≤ 3.0; "
        f"naive ≈ {len(grid)})"
    )
    if args.naive_points >= 0:
        points = len(grid) if args.naive_points == 0 else min(args.naive_points, len(grid))
        subset = type(grid)(grid.t[:points], grid.cutoffs[:points])
        naive_s, naive = timed(
            lambda: naive_curve(
                systems,
                labels,
                labels,
                ordering,
                subset,
                leave_one_out=True,
                distance=args.distance,
            ),
            1,
        )
        naive_full_s = naive_s * len(grid) / points
        scaled = "" if points == len(grid) else f" (measured on {points} points, scaled)"
        print(f"naive loop ({len(grid)} points):                {naive_full_s:8.2f} s{scaled}")
        agree = max(
            float(np.max(np.abs(curve.as_dict()[k][:points] - naive[k])))
            for k in ("top1", "top5", "mAP")
        )
        print(f"max |curve − naive| over top1/top5/mAP:  {agree:.2e}")
        print(f"naive loop / single evaluation:          {naive_full_s / single_s:8.2f}")
        print(f"naive loop / curve (speed-up):           {naive_full_s / curve_s:8.2f}")
    if args.orders > 1:
        shared_orders(systems, labels, grid, args)


def shared_orders(systems: SearchSystems, labels: np.ndarray, grid, args) -> None:
    rng = np.random.default_rng(args.seed + 2)
    orders = [rng.permutation(args.n) for _ in range(args.orders)]
    self_index = np.arange(args.n)
    options = {"self_index": self_index, "distance": args.distance}

    def apart():
        return [
            backfill_curve(systems, labels, labels, o, grid.cutoffs, grid.t, **options)
            for o in orders
        ]

    apart_s, one_by_one = timed(apart, args.repeats)
    shared_s, shared = timed(
        lambda: backfill_curves(systems, labels, labels, orders, grid.cutoffs, grid.t, **options),
        args.repeats,
    )
    same = all(
        np.array_equal(a.per_query.average_precision, b.per_query.average_precision, equal_nan=True)
        and np.array_equal(a.per_query.first_hit, b.per_query.first_hit)
        for a, b in zip(one_by_one, shared, strict=True)
    )
    print(f"{args.orders} orders, one curve each:           {apart_s:8.2f} s")
    print(f"{args.orders} orders sharing the ranking:       {shared_s:8.2f} s   (equal: {same})")
    print(f"apart / shared (speed-up):               {apart_s / shared_s:8.2f}")


if __name__ == "__main__":
    main()
