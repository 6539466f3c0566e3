"""The one loader of params.yaml: its structure, then every plugin it names, against the registries.

``modelupgrade.config`` is a leaf of the library and checks structure only: a strategy or head
``kind``, its ``options``, an ordering policy or a serving mode are plain strings and mappings
there. This module sits above the config and every plugin family and checks each such reference:

- ``strategies.<name>.kind`` is in ``STRATEGIES`` and its ``options`` fit that kind's ``Options``;
- ``heads.<name>.kind`` is in ``HEADS`` and its ``options`` fit that kind's ``Options``;
- ``adopted.<name>.kind`` is in ``MODEL_SOURCES`` and its ``options`` fit that kind's ``Options``;
- ``adapters.heads.<name>`` likewise, its kind a training-free adapter, and no training override
  for a kind fitted in closed form (it runs no epochs);
- ``backfill.policies`` are in ``ORDERINGS`` and ``backfill.serving_modes`` in ``SERVING_MODES``;
- ``store.policy`` is a deployable ordering policy, ``store.serving_mode`` a serving mode and
  ``store.backend`` a vector backend;
- ``dataset.loader`` is in ``LOADERS``, each ``architectures.<name>.classifier`` in
  ``CLASSIFIERS`` and ``evaluation.search.index`` in ``INDEXES``.

Every problem is reported, each naming its params key, in one ``ParamsError``. Front ends (stages,
the CLI, flows, benchmarks) read params.yaml with ``load_params``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from modelupgrade.config import DEFAULT_PARAMS_PATH, HeadParams, Params, read_params
from modelupgrade.config.errors import invalid_params, validation_problems
from modelupgrade.data.loaders import LOADERS
from modelupgrade.heads import HEADS
from modelupgrade.layers import CLASSIFIERS
from modelupgrade.models.adopted import MODEL_SOURCES
from modelupgrade.ordering import ORDERINGS, build_ordering
from modelupgrade.plugins import Registry
from modelupgrade.retrieval.index import INDEXES
from modelupgrade.serving import SERVING_MODES
from modelupgrade.store.backends import VECTOR_BACKENDS
from modelupgrade.strategies import STRATEGIES

__all__ = ["check_params", "load_params", "plugin_problems"]


def load_params(path: str | Path = DEFAULT_PARAMS_PATH) -> Params:
    """The params file at ``path``, its structure and every plugin reference checked."""
    return check_params(read_params(path), path)


def check_params(params: Params, source: str | Path = DEFAULT_PARAMS_PATH) -> Params:
    """``params`` itself if every plugin it names is registered and configured validly."""
    problems = plugin_problems(params)
    if problems:
        raise invalid_params(
            source,
            problems,
            hint="kinds, policies and modes are the registered names listed above; options are "
            "the fields of the kind's Options class",
        )
    return params


def plugin_problems(params: Params) -> list[str]:
    """One line per bad plugin reference of ``params``, each starting with its params key."""
    problems: list[str] = []
    for name, entry in params.strategies.items():
        problems += _kind_problems(f"strategies.{name}", STRATEGIES, entry.kind, entry.options)
    for name, head in params.heads.items():
        problems += _kind_problems(f"heads.{name}", HEADS, head.kind, head.options)
    for name, adopted in params.adopted.items():
        problems += _kind_problems(f"adopted.{name}", MODEL_SOURCES, adopted.kind, adopted.options)
    for name, head in params.adapters.heads.items():
        problems += _adapter_problems(f"adapters.heads.{name}", head)
    for strategy, head_name in params.sequential.heads.items():
        kind = params.heads[head_name].kind
        if kind in HEADS and HEADS.get(kind).direction != "forward":
            problems.append(
                f"sequential.heads.{strategy}: head {head_name!r} is a {kind} head, which does not "
                "refresh the gallery (choose a forward head: it maps each generation's gallery "
                "into the next one's space)"
            )
    problems += _unknown_names("backfill.policies", ORDERINGS, params.backfill.policies)
    problems += _unknown_names(
        "backfill.serving_modes", SERVING_MODES, params.backfill.serving_modes
    )
    problems += _store_policy_problems(params.store.policy)
    problems += _unknown_names("store.serving_mode", SERVING_MODES, [params.store.serving_mode])
    problems += _unknown_names("store.backend", VECTOR_BACKENDS, [params.store.backend])
    problems += _unknown_names("dataset.loader", LOADERS, [params.dataset.loader])
    for name, architecture in params.architectures.items():
        problems += _unknown_names(
            f"architectures.{name}.classifier", CLASSIFIERS, [architecture.classifier]
        )
    problems += _unknown_names("evaluation.search.index", INDEXES, [params.evaluation.search.index])
    return problems


def _unknown(key: str, registry: Registry[Any], name: str, choices: Iterable[str]) -> str:
    return f"{key}: unknown {registry.family} {name!r} (choose one of: {', '.join(choices)})"


def _unknown_names(key: str, registry: Registry[Any], names: Iterable[str]) -> list[str]:
    return [
        _unknown(key, registry, name, registry.names()) for name in names if name not in registry
    ]


def _kind_problems(
    key: str, registry: Registry[Any], kind: str, options: Mapping[str, Any]
) -> list[str]:
    """A plugin entry's ``kind`` is registered and its ``options`` fit that kind's ``Options``."""
    if kind not in registry:
        return [_unknown(f"{key}.kind", registry, kind, registry.names())]
    options_class: type[BaseModel] = registry.get(kind).Options
    try:
        options_class.model_validate(dict(options))
    except ValidationError as err:
        where = f"options of {registry.family} kind {kind!r}"
        return [f"{problem} [{where}]" for problem in validation_problems(err, f"{key}.options")]
    return []


def _adapter_problems(key: str, head: HeadParams) -> list[str]:
    """An adapter of the adapter study is a training-free head kind, configured validly; a kind
    fitted in closed form takes no training overrides (they would be ignored)."""
    problems = _kind_problems(key, HEADS, head.kind, head.options)
    if problems:
        return problems
    head_class = HEADS.get(head.kind)
    if not head_class.training_free:
        training_free = [name for name in HEADS.names() if HEADS.get(name).training_free]
        problem = (
            f"{key}.kind: head kind {head.kind!r} is trained, not a training-free adapter "
            f"(choose one of: {', '.join(training_free)}; trained heads go under 'heads')"
        )
        return [problem]
    if not head_class.iterative:
        return [
            f"{key}.{field}: head kind {head.kind!r} is fitted in closed form and runs no "
            "training; remove it"
            for field in head.training_overrides()
        ]
    return []


def _store_policy_problems(policy: str) -> list[str]:
    # The store backfills real galleries: an upper bound that needs every new vector up front (the
    # simulator's oracle) cannot order one.
    deployable = [name for name in ORDERINGS.names() if build_ordering(name).deployable]
    if policy not in ORDERINGS:
        return [_unknown("store.policy", ORDERINGS, policy, deployable)]
    if policy not in deployable:
        not_deployable = (
            f"store.policy: {ORDERINGS.family} {policy!r} is not deployable: it needs every new "
            f"vector before the backfill starts (choose one of: {', '.join(deployable)})"
        )
        return [not_deployable]
    return []
