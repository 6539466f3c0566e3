"""What to run after a plan: the exact commands that carry out its recommendation on the store
(``next_steps``), with the adapter the plan saved, the plan's serving mode and ordering policy."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.data.vector_table import is_vector_table
from modelupgrade.plan.records import UpgradePlan


@dataclass(frozen=True)
class PlanContext:
    """What the commands name besides the plan: the params file, the models, the labelled
    queries the cutover is gated on, the store, and the plan's own directory."""

    params_file: Path
    old: Path
    new: Path
    queries: Path
    store: Path
    out: Path
    compatible: Path | None = None


@dataclass(frozen=True)
class NextStep:
    """One command and what it does."""

    what: str
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def next_steps(plan: UpgradePlan, context: PlanContext) -> list[NextStep]:
    """The commands that carry out ``plan``'s recommendation, in order (none to keep the old
    model)."""
    option = plan.recommendation.option
    row = plan.row(option)
    backfill = plan.measurements.backfill
    common = ("--params", str(context.params_file), "--store", str(context.store))
    reason = f"plan {context.out}: {option}"
    if row.kind == "query-adapter" and option == "query/slerp":
        return []  # both models embed each query: the caller's query path applies it
    if row.kind == "query-adapter":
        head = str(context.out / str(row.head))
        return [
            NextStep(
                "search the old gallery with the new model's queries through the adapter "
                "(no backfill; QUERIES.npy: the new model's query vectors)",
                (
                    "modelupgrade", "search", *common, "--queries", "QUERIES.npy",
                    "--mode", "rank-merge-rqt", "--reverse-head", head,
                ),
            )
        ]  # fmt: skip
    source: tuple[str, ...]
    if row.kind == "gallery-adapter":
        source = ("--transform-head", str(context.out / str(row.head)), "--space", context.new.name)
    elif option == "reembed":
        source = ("--model", str(context.new))
    elif option == "compatible/backfill" and context.compatible is not None:
        source = ("--model", str(context.compatible))
    else:
        return []
    ordering = ("--mode", str(backfill["mode"]), "--policy", str(backfill["policy"]))
    run = ("modelupgrade", "backfill", *common, *source, *ordering)
    new_model = context.compatible if option == "compatible/backfill" else context.new
    assert new_model is not None
    if is_vector_table(context.old):
        old_side: tuple[str, ...] = ("--old-query-vectors", str(context.old))
    else:
        old_side = ("--old-model", str(context.old))
    gate = (
        "modelupgrade", "cutover", *common, "--query-split", str(context.queries),
        "--new-model", str(new_model), *old_side, "--reason", reason,
    )  # fmt: skip
    return [
        NextStep("check the backfill and time it here (changes nothing)", (*run, "--dry-run")),
        NextStep("backfill the store (resumable: run it again after a stop)", run),
        NextStep("gate the new space on held-out labelled queries, then serve it", gate),
    ]


def steps_markdown(
    steps: list[NextStep], store_exists: bool, context: PlanContext, plan: UpgradePlan
) -> list[str]:
    """The plan's "Next steps" section: the commands in a shell block."""
    option = plan.recommendation.option
    if not steps and option == "query/slerp":
        head = context.out / str(plan.row(option).head)
        serve = (
            f"Nothing for the store to run: SLERP blends each new query with the old model's "
            f"embedding of it, so your query path runs both models and the head in {head} "
            "(`modelupgrade.heads.load_head`) on the pair; the gallery stays as it is."
        )
        return ["## Next steps", "", serve]
    if not steps:
        return ["## Next steps", "", "Nothing to run: keep serving the old model."]
    lines = ["## Next steps", ""]
    if not store_exists:
        ingest = (
            f"The store {context.store} does not exist yet: ingest your gallery with the old "
            "model's vectors first (`modelupgrade store-ingest --store "
            f"{context.store} --items GALLERY --model {context.old} --vectors OLD_VECTORS`)."
        )
        lines += [ingest, ""]
    lines.append("```bash")
    for step in steps:
        lines += [f"# {step.what}", step.command]
    return [*lines, "```"]
