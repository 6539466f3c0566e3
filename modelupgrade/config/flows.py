"""params.yaml: ``flows`` section (Prefect schedules)."""

from __future__ import annotations

from pydantic import Field

from modelupgrade.config.base import Section


class FlowParams(Section):
    upgrade_cron: str = "0 3 * * 1"
    strategy: str = "dmu"
    retries: int = Field(default=2, ge=0)
    retry_delay_seconds: float = Field(default=5.0, ge=0)
