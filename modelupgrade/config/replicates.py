"""params.yaml: ``replicates`` section (the study again at further training seeds).

The DVC study trains every model once, with ``seed``. A verdict on a paper's claim is worth only as
much as the difference it rests on is larger than what another seed would change: the
``replicates`` stage trains, at each of ``seeds``, the models, heads and adapters of the scenarios
listed here again, evaluates them and simulates their backfill, so the report can weigh each claim
against the seeds' spread. It runs only what is listed, since three seeds of the whole study do not
fit the CPU budget.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from modelupgrade.config.base import Section

# Two seeds closer than this would share a derived seed (generation g trains with seed + g, the
# random backfill orders use seed + i for each permutation i).
SEED_SPACING = 100


class ReplicateScenario(Section):
    # Strategies of the scenario trained again at each seed (a subset of the scenario's).
    strategies: list[str] = Field(min_length=1)
    # Heads of the scenario's ``heads`` trained again, each with the strategy it pairs with there.
    heads: list[str] = Field(default_factory=list)
    # Simulate the scenario's backfill again (every policy and serving mode of ``backfill``).
    backfill: bool = False


class ReplicateParams(Section):
    # Training seeds besides ``seed``; none: the study rests on one seed.
    seeds: list[int] = Field(default_factory=list)
    scenarios: dict[str, ReplicateScenario] = Field(default_factory=dict)
    # The backfill orders and serving modes simulated again (subsets of ``backfill``'s); empty:
    # all of the study's.
    policies: list[str] = Field(default_factory=list)
    serving_modes: list[str] = Field(default_factory=list)
    # Seeds trained side by side, one process each (the CPU threads are shared among them).
    workers: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _distinct_seeds(self) -> ReplicateParams:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"replicates.seeds repeats a seed: {self.seeds}")
        if self.seeds and not self.scenarios:
            raise ValueError(
                "replicates.seeds is set but replicates.scenarios lists nothing to train again"
            )
        return self
