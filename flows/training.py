"""Flow ``train-generation``: the GPU part of an upgrade cycle, deployable on a GPU work pool.

It trains generation ``generation`` of the chain with ``flows.strategy`` against the generation
before it (or, given ``new_model``, takes that model made elsewhere instead: ``modelupgrade adopt``
wrote it), the Δ↓ oracle (``evaluation.oracle_strategy``) beside it, embeds the evaluation splits
with each, and trains the ``flows.heads`` between the two generations. The upgrade flow runs it in
its own process, or, when ``flows.training_deployment`` names a deployment of it on a GPU work
pool, as a flow run there (the work directory must then be on storage both machines see).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.tasks import embed_snapshot, take_model, train_head, train_model
from modelupgrade.chain import load_chain
from modelupgrade.config import DEFAULT_PARAMS_FILE, ParamsFile
from modelupgrade.orchestration import with_retries


@flow(name="train-generation")
def train_generation(
    generation: int,
    params_path: ParamsFile = DEFAULT_PARAMS_FILE,
    work_dir: str | None = None,
    new_model: str | None = None,
) -> dict[str, Any]:
    """Train a generation of the chain, its oracle and the heads between it and the one before.

    Args:
        generation: the generation to train (0: the first, shared by the oracle chain)
        params_path: the params file
        work_dir: where the flows keep their files (default: flows.work_dir)
        new_model: take this model directory (adopted, or trained elsewhere) as the generation
            instead of training it
    """
    chain = load_chain(params_path, work_dir)
    args = chain.reference
    train = with_retries(train_model, chain.params)
    if new_model is None:
        models = {chain.strategy: train(*args, generation, chain.strategy)}
    else:
        take = with_retries(take_model, chain.params)
        models = {chain.strategy: take(*args, generation, new_model)}
    heads: dict[str, str] = {}
    if generation > 0:
        if chain.oracle:
            models[chain.oracle] = train(*args, generation, chain.oracle)
        if chain.heads:
            embed = with_retries(embed_snapshot, chain.params)
            embed(*args, generation - 1, generation)
            embed(*args, generation, generation)
            for head in chain.heads:
                heads[head] = with_retries(train_head, chain.params)(*args, generation, head)
    return {"models": models, "heads": heads}
