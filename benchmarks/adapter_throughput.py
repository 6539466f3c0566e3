"""Embeddings transformed per second by the default DMU forward adapter, against the machine's peak.

    python -m benchmarks.adapter_throughput [--dim 128] [--hidden 1024] [--rows 131072] [--check]

For each device (CPU, and CUDA when present) it measures, in the same run:

* the float32 matmul rate of a large square GEMM (GFLOP/s), taken as the attainable peak;
* embeddings/s of the head (3 × [fc-bn-relu] + fc, hidden 1024) through ``inference_copy`` (BN
  folded, batched, inference mode), and end to end through ``modelupgrade.heads.apply``
  (numpy in and out);
* the ratio of the head's rate to the rate its FLOP count allows at that peak
  (peak FLOP/s ÷ FLOPs per embedding), median over interleaved (peak, head) pairs. ``--check`` exits
  non-zero when it is below 0.5.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from modelupgrade.heads import apply, build_head, inference_copy


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(
    fn: Callable[[], object], device: torch.device, repeats: int, min_seconds: float = 0.2
) -> float:
    """Median over ``repeats`` of the time per call, each repeat looping until ``min_seconds``."""
    fn()
    _synchronize(device)
    timings = []
    for _ in range(repeats):
        calls = 0
        started = time.perf_counter()
        while True:
            fn()
            calls += 1
            _synchronize(device)
            elapsed = time.perf_counter() - started
            if elapsed >= min_seconds:
                break
        timings.append(elapsed / calls)
    return statistics.median(timings)


def matmul_gflops(device: torch.device, size: int, repeats: int) -> float:
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    with torch.inference_mode():
        seconds = best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    return 2.0 * size**3 / seconds / 1e9


def benchmark_device(device: torch.device, args: argparse.Namespace) -> dict[str, float]:
    head = build_head("dmu", args.dim, args.dim, args.hidden, args.depth)
    # Non-trivial BN statistics, so folding does real work.
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    head.eval()
    macs = head.macs_per_embedding()["transform"]
    flops_per_row = 2 * macs
    frozen = inference_copy(head, device)
    vectors = np.random.default_rng(0).normal(size=(args.rows, args.dim)).astype(np.float32)
    on_device = torch.from_numpy(vectors).to(device)

    def run_batches() -> None:
        for start in range(0, args.rows, args.batch_size):
            frozen(on_device[start : start + args.batch_size])

    with torch.inference_mode():
        # Interleave short peak and head measurements and pair them: on a shared machine the load
        # changes between measurements, and a ratio of adjacent ones is what the load leaves fair.
        pairs = []
        for _ in range(args.repeats):
            peak = matmul_gflops(device, args.matmul_size, 1)
            seconds = best_seconds(run_batches, device, 1)
            pairs.append((peak, args.rows / seconds))
    end_to_end_seconds = best_seconds(
        lambda: apply(head, vectors, batch_size=args.batch_size, device=device),
        device,
        args.repeats,
    )
    peak_after = matmul_gflops(device, args.matmul_size, 1)
    ratios = [rate * flops_per_row / (peak * 1e9) for peak, rate in pairs]
    median_pair = sorted(pairs, key=lambda pair: pair[1] * flops_per_row / pair[0])[len(pairs) // 2]
    peak, rate = median_pair
    allowed = peak * 1e9 / flops_per_row
    return {
        "macs": macs,
        "peak_gflops": peak,
        "peak_spread": (max(p for p, _ in pairs) - min(p for p, _ in pairs))
        / max(p for p, _ in pairs),
        "rate": rate,
        "end_to_end_rate": args.rows / end_to_end_seconds,
        "allowed_rate": allowed,
        "ratio": statistics.median(ratios),
        "end_to_end_ratio": args.rows / end_to_end_seconds / (peak_after * 1e9 / flops_per_row),
        "head_gflops": rate * flops_per_row / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (old and new)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width (DMU default 1024)")
    parser.add_argument("--depth", type=int, default=4, help="linear layers (DMU: 4)")
    parser.add_argument("--rows", type=int, default=131072, help="embeddings per timed pass")
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument(
        "--matmul-size", type=int, default=2048, help="square GEMM size for the peak"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument("--device", choices=["all", "cpu", "cuda"], default="all")
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio is below 0.5")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    devices = []
    if args.device in ("all", "cpu"):
        devices.append(torch.device("cpu"))
    if args.device in ("all", "cuda") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(
        f"DMU forward adapter {args.dim} -> {args.hidden} x{args.depth - 1} -> {args.dim}, "
        f"batch {args.batch_size}, {args.rows} rows, torch {torch.__version__}"
    )
    ok = True
    for device in devices:
        name = (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads)"
        )
        r = benchmark_device(device, args)
        print(f"[{name}]")
        print(f"  MACs per embedding          {r['macs']:>14,d}  ({2 * r['macs']:,d} FLOPs)")
        print(
            f"  matmul peak (fp32 GEMM)     {r['peak_gflops']:>14.1f} GFLOP/s  (median pair; "
            f"spread over pairs {r['peak_spread']:.1%})"
        )
        print(f"  rate allowed at that peak   {r['allowed_rate']:>14,.0f} embeddings/s")
        print(
            f"  head (folded, batched)      {r['rate']:>14,.0f} embeddings/s  = "
            f"{r['head_gflops']:.1f} GFLOP/s"
        )
        print(f"  apply() end to end (numpy)  {r['end_to_end_rate']:>14,.0f} embeddings/s")
        print(
            f"  ratio head / allowed        {r['ratio']:>14.2f}   (end to end "
            f"{r['end_to_end_ratio']:.2f}; target >= 0.50)"
        )
        ok &= r["ratio"] >= 0.5
    if args.check and not ok:
        print("FAIL: the head reaches less than 50% of the rate its FLOPs allow", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
