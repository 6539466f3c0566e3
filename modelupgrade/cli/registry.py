"""``modelupgrade promote`` and ``modelupgrade lineage``: the model registry from the shell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from modelupgrade.errors import UserError

ParamsOption = Annotated[
    Path, typer.Option("--params", help="params file (registry section: tracking URI, model name)")
]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", help="registered model name (default: <registry.model_name>-<scenario>)"),
]
ScenarioOption = Annotated[
    str | None, typer.Option("--scenario", help="scenario whose registered model to use")
]


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_command)
    app.command("lineage")(lineage_command)


def _open(params_path: Path):  # noqa: ANN202 - returns (Params, Tracker); mlflow imported lazily
    from modelupgrade.plugins import load_params
    from modelupgrade.registry import Tracker

    params = load_params(params_path)
    return params, Tracker.from_params(params)


def _model_names(tracker, prefix: str) -> list[str]:  # noqa: ANN001
    models = tracker.client.search_registered_models()
    return sorted(m.name for m in models if m.name.startswith(prefix + "-"))


def _resolve_model(tracker, params, model: str | None, scenario: str | None) -> str:  # noqa: ANN001
    from modelupgrade.registry import registered_model_name

    if model:
        return model
    prefix = params.registry.model_name
    if scenario:
        return registered_model_name(prefix, scenario)
    names = _model_names(tracker, prefix)
    if len(names) == 1:
        return names[0]
    raise UserError(
        "say which registered model: " + (f"there are {len(names)}" if names else "there are none"),
        hint=("pass --scenario or --model; registered: " + ", ".join(names))
        if names
        else "run the register stage first (dvc repro, or python -m stages.register)",
    )


def promote_command(
    version: Annotated[int, typer.Option("--version", help="model version to make champion")],
    reason: Annotated[str, typer.Option("--reason", help="why (recorded in a version tag)")],
    force: Annotated[
        bool, typer.Option("--force", help="promote even though the version failed its gates")
    ] = False,
    scenario: ScenarioOption = None,
    model: ModelOption = None,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Move the `champion` alias to a version; refuses one whose gates failed unless --force."""
    from modelupgrade.registry import ModelRegistry, promote

    params, tracker = _open(params_path)
    registry = ModelRegistry(tracker, _resolve_model(tracker, params, model, scenario))
    result = promote(registry, version, reason, force=force)
    previous = f"v{result.previous_champion}" if result.previous_champion else "none"
    typer.echo(
        f"{registry.name}: champion is now v{result.version} (was {previous}), "
        f"promoted by {result.user}{' with --force' if result.forced else ''}: {result.reason}"
    )
    for note in result.notes:
        typer.echo(f"note: {note}")


def lineage_command(
    scenario: ScenarioOption = None,
    model: ModelOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print rows as JSON")] = False,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Print the generation tree: version, parent, strategy, gates, aliases."""
    from modelupgrade.registry import ModelRegistry, format_lineage, lineage_rows

    params, tracker = _open(params_path)
    if model or scenario:
        names = [_resolve_model(tracker, params, model, scenario)]
    else:
        names = _model_names(tracker, params.registry.model_name)
        if not names:
            raise UserError(
                f"no registered model named {params.registry.model_name}-<scenario> in "
                f"{tracker.config.tracking_uri}",
                hint="run the register stage first (dvc repro, or python -m stages.register)",
            )
    if as_json:
        rows = {name: lineage_rows(ModelRegistry(tracker, name).versions()) for name in names}
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo("\n\n".join(format_lineage(n, ModelRegistry(tracker, n).versions()) for n in names))
