"""params.yaml: ``flows`` section (the Prefect flows: schedules, strategy,
retries, where outputs go).

The flows (``flows/``) run the same stage functions as ``dvc repro``, one upgrade cycle at a time,
in a work directory of their own and against a registered model of their own, so that a scheduled
upgrade never mixes its generations with the DVC study's.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from modelupgrade.config.base import Section


class FlowParams(Section):
    # Cron (UTC) of the served upgrade deployment: one upgrade cycle per run,
    # Mondays 03:00 by default.
    upgrade_cron: str = "0 3 * * 1"
    # Cron (UTC) of the served backfill deployment: each run re-embeds the gallery store when
    # ``champion`` has moved since the last one, and does nothing otherwise.
    backfill_cron: str = "*/15 * * * *"
    # Compatibility strategy of every new generation (an entry of ``strategies``). A chain keeps the
    # strategy it started with: each generation is trained against the one before it.
    strategy: str = "dmu"
    # Heads (entries of ``heads``) trained in each cycle between the previous generation and the new
    # one, on the new snapshot, and registered beside the new model.
    heads: list[str] = Field(default_factory=list)
    # Retries of a task after a transient failure; bad input (a UserError, a ParamsError) is never
    # retried.
    retries: int = Field(default=2, ge=0)
    retry_delay_seconds: float = Field(default=5.0, ge=0)
    # Directory of the flows' data snapshots, models, embeddings, metrics, reports and gallery store
    # (relative paths are taken from the directory the flow is started in).
    work_dir: str = "runs/flows"
    # ``registry.model_name`` of the flows' generations (registered model ``<name>-sequential``);
    # None: ``<registry.model_name>-flows``, apart from the models the DVC pipeline registers.
    model_name: str | None = None
    # A deployment of the ``train-generation`` flow on a GPU work pool, e.g. "train-generation/gpu"
    # (``python -m flows.serve --training-pool gpu`` creates it); None: train in the
    # flow's own process.
    training_deployment: str | None = None

    @field_validator("upgrade_cron", "backfill_cron")
    @classmethod
    def _five_cron_fields(cls, cron: str) -> str:
        # Prefect validates the fields themselves when it serves the deployment; the count catches
        # the common slip (a seconds field, a missing one) when params.yaml is loaded.
        fields = cron.split()
        if len(fields) != 5:
            raise ValueError(
                f"a cron schedule has 5 fields (minute hour day-of-month month day-of-week), "
                f"got {len(fields)} in {cron!r}"
            )
        return cron

    @field_validator("training_deployment")
    @classmethod
    def _flow_slash_deployment(cls, name: str | None) -> str | None:
        if name is not None and name.count("/") != 1:
            raise ValueError(f"a deployment is named '<flow>/<deployment>', got {name!r}")
        return name
