"""The registered generations of an upgrade chain: which there are, which serves, which comes next.

An upgrade chain (``modelupgrade.chain``) registers ``gen0 → <strategy>/gen1 → <strategy>/gen2 …``
into one registered model, one cycle at a time. Before a cycle trains the next generation it reads
the chain back here and checks that every registered generation is the model in the chain's work
directory (the same checkpoint): the next generation trains against them and the evaluation reads
their embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelupgrade.errors import UserError
from modelupgrade.io import file_sha256
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.layout import SEQUENTIAL, StudyLayout, chain_generation
from modelupgrade.models.persistence import WEIGHTS_FILE
from modelupgrade.registry.versions import TAG_CHECKPOINT, ModelRegistry, VersionInfo


@dataclass(frozen=True)
class ChainChampion:
    """The version that serves, and the generation of the chain it is."""

    version: int
    model_key: str
    generation: int

    def as_dict(self) -> JsonObject:
        return json_record(self)


@dataclass(frozen=True)
class ChainState:
    """The chain's registered generations (0, 1, …, without gaps) and its champion."""

    registered_model: str
    tracking_uri: str
    generations: list[int]
    champion: ChainChampion | None

    @property
    def next_generation(self) -> int:
        return len(self.generations)

    def as_dict(self) -> JsonObject:
        fields = json_record(self)  # the champion too, as its own as_dict
        champion = fields.pop("champion")
        return {**fields, "next_generation": self.next_generation, "champion": champion}


def read_chain(registry: ModelRegistry, strategy: str, layout: StudyLayout) -> ChainState:
    """The state of ``strategy``'s chain registered in ``registry``, its models in ``layout``.

    Refuses a registered model holding versions of another chain, versions whose checkpoint is not
    the model in ``layout``, and a chain with gaps.
    """
    newest: dict[int, VersionInfo] = {}
    for version in registry.versions():
        generation = chain_generation(version.model_key, strategy)
        if generation is None:
            raise UserError(
                f"registered model {registry.name!r} holds {version.model_key!r} "
                f"(v{version.version}), which is not in the {strategy!r} chain",
                hint="a chain keeps its strategy: set flows.strategy back, or flows.model_name to "
                "start a new one",
            )
        newest[generation] = version  # versions come oldest first: a re-registration wins
    for generation, version in sorted(newest.items()):
        model_dir = layout.model(SEQUENTIAL, layout.sequential_model_name(strategy, generation))
        checkpoint = model_dir / WEIGHTS_FILE
        if not checkpoint.is_file() or file_sha256(checkpoint) != version.tags.get(TAG_CHECKPOINT):
            raise UserError(
                f"{registry.name!r} v{version.version} ({version.model_key}) is not the model in "
                f"{model_dir}",
                hint="run with the --work-dir that trained this chain, or set flows.model_name to "
                "start a new chain",
            )
    generations = sorted(newest)
    if generations != list(range(len(generations))):
        raise UserError(f"{registry.name!r} has generations {generations}, with gaps in the chain")
    champion = registry.champion()
    champion_entry = None
    if champion is not None:
        generation = chain_generation(champion.model_key, strategy)
        assert generation is not None  # every registered key is in the chain (checked above)
        champion_entry = ChainChampion(champion.version, champion.model_key, generation)
    return ChainState(
        registered_model=registry.name,
        tracking_uri=registry.tracker.config.tracking_uri,
        generations=generations,
        champion=champion_entry,
    )
