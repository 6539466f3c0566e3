"""Batched inference of heads: BatchNorm folded into the linear layers, large float32 batches.

``apply`` is what the gallery refresh, the query path and the evaluation call. An inference copy of
the head replaces every MLP by a ``FoldedMLP`` (one addmm + in-place ReLU per layer), so a batch
costs exactly its linear algebra; rows are never visited one by one in Python.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head
from modelupgrade.layers import MLP, Transform

DEFAULT_BATCH_SIZE = 8192


class FoldedMLP(Transform):
    """An eval-mode ``MLP`` with each BatchNorm folded into the Linear before it."""

    def __init__(self, weights_t: list[torch.Tensor], biases: list[torch.Tensor]) -> None:
        super().__init__()
        # Stored transposed (in × out) and contiguous: x @ W^T becomes one row-major GEMM.
        self.weights_t = nn.ParameterList(nn.Parameter(w, requires_grad=False) for w in weights_t)
        self.biases = nn.ParameterList(nn.Parameter(b, requires_grad=False) for b in biases)

    @classmethod
    def from_mlp(cls, mlp: MLP) -> FoldedMLP:
        weights_t, biases = [], []
        modules = list(mlp.net)
        for i, module in enumerate(modules):
            if not isinstance(module, nn.Linear):
                continue
            weight = module.weight.detach().double()
            bias = (
                module.bias.detach().double()
                if module.bias is not None
                else torch.zeros(module.out_features, dtype=torch.float64, device=weight.device)
            )
            following = modules[i + 1] if i + 1 < len(modules) else None
            if isinstance(following, nn.BatchNorm1d):
                # The MLP's batch norms track running statistics (BatchNorm1d's default).
                assert following.running_var is not None and following.running_mean is not None
                scale = following.weight.detach().double() / torch.sqrt(
                    following.running_var.detach().double() + following.eps
                )
                weight = weight * scale[:, None]
                bias = (
                    bias - following.running_mean.detach().double()
                ) * scale + following.bias.detach().double()
            weights_t.append(weight.T.contiguous().float())
            biases.append(bias.float())
        return cls(weights_t, biases)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.weights_t) - 1
        for i, (weight_t, bias) in enumerate(zip(self.weights_t, self.biases, strict=True)):
            x = torch.addmm(bias, x, weight_t)
            if i < last:
                x = x.relu_()
        return x

    def macs_per_row(self) -> int:
        return sum(w.shape[0] * w.shape[1] for w in self.weights_t)


def inference_copy(head: Head, device: torch.device | str | None = None) -> Head:
    """A frozen, eval-mode copy of ``head`` whose MLPs are folded; the original is untouched."""
    frozen = copy.deepcopy(head).eval()
    for name, module in list(frozen.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, MLP):
                setattr(module, child_name, FoldedMLP.from_mlp(child))
    frozen.requires_grad_(False)
    return frozen.to(device) if device is not None else frozen


def _as_float32_rows(vectors: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise UserError(f"{what} must be a 2-D array (N, D), got shape {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    # torch.from_numpy refuses to share read-only memory (np.load mmap, pandas) without a warning.
    return array if array.flags.writeable else array.copy()


class FrozenHead:
    """A head folded once for inference, run over numpy vectors in batches of ``batch_size``.

    The simulator's head outputs and the store's transforms both run heads through this class, so
    the same vectors give the same outputs wherever a head is applied.
    """

    def __init__(
        self,
        head: Head,
        device: torch.device | str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size must be ≥ 1, got {batch_size}")
        self.head, self.batch_size = head, batch_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.frozen = inference_copy(head, self.device)

    def outputs(
        self, vectors: np.ndarray, side_info: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Every named output of the head on ``vectors``, as float32 arrays."""
        head, device, batch_size = self.head, self.device, self.batch_size
        vectors = _as_float32_rows(vectors, "input vectors")
        if side_info is not None:
            side_info = _as_float32_rows(side_info, "side information")
            if len(side_info) != len(vectors):
                raise UserError(
                    f"{len(side_info)} side-information rows for {len(vectors)} input vectors"
                )
        head.check_input(vectors.shape[1], None if side_info is None else side_info.shape[1])
        results: dict[str, np.ndarray] = {}
        with torch.inference_mode():
            for start in range(0, len(vectors), batch_size):
                stop = min(start + batch_size, len(vectors))
                x = torch.from_numpy(vectors[start:stop]).to(device, non_blocking=True)
                extra = (
                    None
                    if side_info is None
                    else torch.from_numpy(side_info[start:stop]).to(device)
                )
                for name, value in self.frozen.outputs(x, extra).items():
                    if name not in results:
                        shape = (len(vectors), *value.shape[1:])
                        results[name] = np.empty(shape, dtype=np.float32)
                    results[name][start:stop] = value.float().cpu().numpy()
        if not results:  # zero rows: shapes from a one-row dry run
            with torch.inference_mode():
                x = torch.zeros(1, head.in_dim, device=device)
                extra = (
                    None if side_info is None else torch.zeros(1, head.side_info_dim, device=device)
                )
                for name, value in self.frozen.outputs(x, extra).items():
                    results[name] = np.empty((0, *value.shape[1:]), dtype=np.float32)
        return results

    def output(self, name: str = "transform") -> Callable[[np.ndarray], np.ndarray]:
        """The vectors → vectors callable of one named output."""
        if name not in self.head.output_names:
            raise UserError(
                f"head {self.head.registry_name!r} has no output {name!r}",
                hint=f"its outputs are: {', '.join(self.head.output_names)}",
            )
        return lambda vectors: self.outputs(vectors)[name]


def apply(
    head: Head,
    vectors: np.ndarray,
    batch_size: int = DEFAULT_BATCH_SIZE,
    side_info: np.ndarray | None = None,
    device: torch.device | str | None = None,
    output: str = "transform",
) -> np.ndarray:
    """Transform ``vectors`` with ``head``; ``output`` picks a named output
    (default: the transform)."""
    frozen = FrozenHead(head, device, batch_size)
    frozen.output(output)  # an unknown output is refused before any work
    return frozen.outputs(vectors, side_info)[output]


def apply_with_uncertainty(
    head: Head,
    vectors: np.ndarray,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: torch.device | str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(transformed vectors, σ²) in one pass, for heads that predict an uncertainty (FastFill)."""
    if "log_variance" not in head.output_names:
        raise UserError(
            f"head {head.registry_name!r} predicts no uncertainty",
            hint="σ² comes from a FastFill head (kind: fastfill)",
        )
    out = FrozenHead(head, device, batch_size).outputs(vectors)
    return out["transform"], np.exp(out["log_variance"]).astype(np.float32)
