"""A trained head's outputs on one scenario's evaluation embeddings, written as the files that the
evaluate and simulate_backfill stages read, so that no later stage runs the head again.

Forward heads (ψ: old → new) transform the old gallery: ``gallery.npy``, and for FastFill the
predicted uncertainty ``gallery_sigma2.npy`` that orders its backfill. Reverse heads (ψ_rev: new →
old) transform the new queries: ``query.npy``; Seo et al.'s full method also writes its learnt new
embedding ρ(φ_new) of the queries and of the gallery: ``rho_query.npy`` and ``rho_gallery.npy``
(its ``query.npy`` is then ψ_rev(ρ(φ_new(q)))). A reverse head that also reads the old model's
embedding of the query (SLERP, ``Head.takes_old_embedding``) gets the old query embeddings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from modelupgrade.errors import UserError
from modelupgrade.heads.base import HEADS
from modelupgrade.heads.chain import HeadChain, load_chain
from modelupgrade.heads.inference import FrozenHead
from modelupgrade.heads.persistence import load_head, read_head_card
from modelupgrade.io import atomic_path
from modelupgrade.layout import (
    GALLERY_SPLIT,
    QUERY_SPLIT,
    RHO_GALLERY_FILE,
    RHO_QUERY_FILE,
    SIGMA2_FILE,
    embedding_file_name,
)


def _embeddings(directory: Path, split: str) -> np.ndarray:
    path = directory / embedding_file_name(split)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist", hint="embed the evaluation splits with that model first"
        )
    return np.load(path, allow_pickle=False)


def write_head_outputs(
    head_dir: str | Path,
    old_embeddings: str | Path,
    new_embeddings: str | Path,
    out_dir: str | Path,
    device: torch.device | str | None = None,
) -> list[Path]:
    """Write ``head_dir``'s outputs on
    ``<old|new>_embeddings/{query,gallery}.npy`` into ``out_dir``."""
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    card = read_head_card(head_dir)
    if card.side_info_dim and not HEADS.get(card.kind).takes_old_embedding:
        raise UserError(
            f"head {head_dir} needs side information, which the evaluation embeddings do not carry",
            hint="train it without --side-info for the pipeline, or write its "
            "gallery transform yourself",
        )
    arrays: dict[str, np.ndarray] = {}
    if card.direction == "forward":
        # The chain's earlier generations give the last head its input; the last head runs with all
        # its outputs, so that FastFill's σ² comes from the same pass as the transform.
        chain = load_chain(head_dir)
        earlier = HeadChain(chain.heads[:-1], chain.momenta[:-1])
        states = earlier.gallery_states(
            _embeddings(Path(old_embeddings), GALLERY_SPLIT), device=device
        )
        outputs = FrozenHead(chain.heads[-1], device).outputs(
            chain.input_of(states, chain.momenta[-1])
        )
        arrays[embedding_file_name(GALLERY_SPLIT)] = outputs["transform"]
        if "log_variance" in outputs:
            arrays[SIGMA2_FILE] = np.exp(outputs["log_variance"]).reshape(-1)
    else:
        head, _ = load_head(head_dir)
        new = Path(new_embeddings)
        frozen = FrozenHead(head, device)
        old_query = (
            _embeddings(Path(old_embeddings), QUERY_SPLIT) if head.takes_old_embedding else None
        )
        outputs = frozen.outputs(_embeddings(new, QUERY_SPLIT), old_query)
        arrays[embedding_file_name(QUERY_SPLIT)] = outputs["transform"]
        if "new_embedding" in outputs:
            arrays[RHO_QUERY_FILE] = outputs["new_embedding"]
            arrays[RHO_GALLERY_FILE] = frozen.outputs(_embeddings(new, GALLERY_SPLIT))[
                "new_embedding"
            ]
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name, array in arrays.items():
            with open(tmp / name, "wb") as fh:
                np.save(fh, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
    return [out_dir / name for name in arrays]
