"""A team's own upgrade through ``dvc repro``: ``modelupgrade upgrade NAME`` (dvc.yaml's
``upgrade@<name>``) adopts the two models params.yaml's ``upgrades.<name>`` names, plans the upgrade
for the team's gallery with ``modelupgrade plan``'s own code, and writes the report whose lead is
that plan."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.commands.plan import PlanWritten
from modelupgrade.config import Params, UpgradeParams
from modelupgrade.errors import UserError

UPGRADES_DIR = Path("upgrades")


@dataclass(frozen=True)
class UpgradeLayout:
    """Where ``upgrade@<name>`` writes: one directory, the stage's one output."""

    root: Path

    @property
    def old_model(self) -> Path:
        return self.root / "models" / "old"

    @property
    def new_model(self) -> Path:
        return self.root / "models" / "new"

    @property
    def plan(self) -> Path:
        return self.root / "plan"

    @property
    def report(self) -> Path:
        return self.root / "report"

    def check_replaceable(self) -> None:
        """The directory is new, or an earlier upgrade's (each part is replaced whole): never
        another directory that would be written into."""
        ours = {path.name for path in (self.old_model.parent, self.plan, self.report)}
        if self.root.is_dir() and {path.name for path in self.root.iterdir()} - ours:
            raise UserError(
                f"{self.root} holds files that are not an upgrade's ({', '.join(sorted(ours))})",
                hint="pass --out a new directory, or the one an earlier upgrade wrote",
            )


@dataclass
class UpgradeWritten:
    """The upgrade's plan and the report that leads with it."""

    name: str
    layout: UpgradeLayout
    planned: PlanWritten
    report: list[Path]

    def as_dict(self) -> dict[str, object]:
        return {
            "upgrade": self.name,
            "recommendation": self.planned.plan.recommendation.option,
            "plan": str(self.layout.plan),
            "report": [str(p) for p in self.report],
            "next_commands": [step.command for step in self.planned.steps],
        }

    def describe(self) -> str:
        written = "\n".join(f"wrote {p}" for p in self.report)
        return f"{self.planned.describe()}\n{written}"


def upgrade(params: Params, name: str, out: Path | None = None) -> UpgradeWritten:
    """Your own upgrade through dvc repro: adopt both models of params.yaml's upgrades.<name>,
    plan the upgrade for your gallery and write its report, whose lead is the plan.

    Writes OUT/models/old and OUT/models/new (as `modelupgrade adopt`), OUT/plan (as `modelupgrade
    plan`: plan.json, plan.md, plan.csv and the fitted adapters) and OUT/report (report.md and
    report.html). Everything the entry reads (its models' files, its tables, the images they name)
    must lie under its 'inputs' directory, which dvc.yaml's upgrade@<name> stage depends on: a
    file outside it would change without dvc repro noticing. Nothing is left half-written.

    Args:
        params: the params file: upgrades.<name>, the adopted models it names, evaluation and
            adapters
        name: an entry of 'upgrades' in params.yaml
        out: directory to write (default: upgrades/<name>)
    """
    if name not in params.upgrades:
        raise UserError(
            f"params.yaml has no upgrade named {name!r}",
            hint=f"entries under 'upgrades': {', '.join(params.upgrades) or 'none'} "
            "(params/your-upgrade.yaml shows one)",
        )
    from modelupgrade.plan.upgrade_inputs import check_upgrade_inputs

    entry = params.upgrades[name]
    check_upgrade_inputs(params, name)
    layout = UpgradeLayout(Path(out) if out is not None else UPGRADES_DIR / name)
    layout.check_replaceable()
    created = not layout.root.exists()
    try:
        return _run(params, name, entry, layout)
    except BaseException:
        if created:  # nothing half-written; what was there before is another run's, whole
            shutil.rmtree(layout.root, ignore_errors=True)
        raise


def _run(params: Params, name: str, entry: UpgradeParams, layout: UpgradeLayout) -> UpgradeWritten:
    from modelupgrade.commands.adopt import adopt
    from modelupgrade.commands.plan import plan
    from modelupgrade.report.your_upgrade import (
        AdoptedModelFacts,
        SampleFacts,
        upgrade_blocks,
        write_upgrade_report,
    )

    tables = [Path(path) for path in entry.files().values()]
    old = adopt(params, entry.old, out=layout.old_model, split=tables)
    new = adopt(params, entry.new, out=layout.new_model, split=tables)
    planned = plan(
        params,
        old=layout.old_model,
        new=layout.new_model,
        sample=Path(entry.sample),
        gallery_size=entry.gallery_size,
        out=layout.plan,
        query=None if entry.query is None else Path(entry.query),
        gallery=None if entry.gallery is None else Path(entry.gallery),
        tolerance_pct=entry.tolerance_pct,
        fit_fraction=entry.fit_fraction,
    )
    models = [
        AdoptedModelFacts("production (old)", entry.old, old.card),
        AdoptedModelFacts("candidate (new)", entry.new, new.card),
    ]
    commands = [step.command for step in planned.steps]
    sample = SampleFacts.of(entry)
    blocks = upgrade_blocks(name, planned.plan, models, sample, commands)
    return UpgradeWritten(name, layout, planned, write_upgrade_report(layout.report, name, blocks))
