"""Flow ``train-generation``: the GPU part of an upgrade cycle, deployable on a GPU work pool.

It trains generation ``generation`` of the chain with ``flows.strategy`` against the generation
before it, the Δ↓ oracle (``evaluation.oracle_strategy``) beside it, embeds the evaluation splits
with each, and trains the ``flows.heads`` between the two generations. The upgrade flow runs it in
its own process, or, when ``flows.training_deployment`` names a deployment of it on a GPU work pool,
as a flow run there (the work directory must then be on storage both machines see).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.layout import load_settings
from flows.tasks import embed_snapshot, train_head, train_model, with_retries


@flow(name="train-generation")
def train_generation(generation: int, params_path: str = "params.yaml", work_dir: str | None = None) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    args = (str(settings.params_path), str(settings.work.root))
    train = with_retries(train_model, settings.params)
    models = {settings.strategy: train(*args, generation, settings.strategy)}
    heads: dict[str, str] = {}
    if generation > 0:
        if settings.oracle:
            models[settings.oracle] = train(*args, generation, settings.oracle)
        if settings.heads:
            embed = with_retries(embed_snapshot, settings.params)
            embed(*args, generation - 1, generation)
            embed(*args, generation, generation)
            for head in settings.heads:
                heads[head] = with_retries(train_head, settings.params)(*args, generation, head)
    return {"models": models, "heads": heads}
