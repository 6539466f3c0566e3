"""The report of a team's own upgrade (dvc.yaml's ``upgrade@<name>``): its lead is the plan for the
team's gallery, printed from the same ``UpgradePlan`` cells as ``plan.md``, then the team's data and
models as they are (its ids, its image sizes, the adopted models' sources and dimensions), and the
commands that carry the recommendation out. The paper study's scenarios are its own report's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelupgrade.config import UpgradeParams
from modelupgrade.io import atomic_path, write_text
from modelupgrade.models.card import ModelCard
from modelupgrade.plan.records import UpgradePlan
from modelupgrade.report.document import (
    Block,
    BulletList,
    CodeBlock,
    Heading,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)

REPORT_MARKDOWN, REPORT_HTML = "report.md", "report.html"


@dataclass(frozen=True)
class AdoptedModelFacts:
    """One adopted model as the report names it."""

    role: str  # "production (old)" or "candidate (new)"
    name: str  # its entry under params.yaml's adopted
    card: ModelCard

    def row(self) -> list[object]:
        adopted = self.card.adopted
        assert adopted is not None, f"{self.name} was not adopted"
        return [
            self.role,
            self.name,
            adopted.kind,
            Path(adopted.source).name,
            adopted.embedding_from,
            self.card.embedding_dim,
            "yes" if adopted.runs_on_images else "no (stored vectors only)",
        ]


@dataclass(frozen=True)
class SampleFacts:
    """The team's labelled sample as the plan read it."""

    images: int
    classes: int
    first_ids: list[str]
    image_sizes: list[str]  # e.g. ["64×64"], the distinct sizes of the first images read
    description: str

    @classmethod
    def of(cls, entry: UpgradeParams) -> SampleFacts:
        """What the report says of the upgrade's sample: its size, classes, ids, image sizes."""
        from PIL import Image

        from modelupgrade.data.image_table import read_image_rows

        rows = read_image_rows(entry.sample, "the upgrade's sample")
        sizes = set()
        for path in rows["path"].head(20):
            with Image.open(path) as image:
                sizes.add(f"{image.width}×{image.height}")
        return cls(
            images=len(rows),
            classes=int(rows["label"].nunique()),
            first_ids=[str(item) for item in rows["item_id"].head(3)],
            image_sizes=sorted(sizes),
            description=entry.description,
        )

    def sentence(self, gallery_size: int) -> str:
        ids = ", ".join(self.first_ids)
        sizes = " / ".join(self.image_sizes) or "not images (stored vectors)"
        said = f"{self.description}: " if self.description else ""
        return (
            f"{said}a labelled sample of {self.images:,} images in {self.classes} classes "
            f"(ids such as {ids}; {sizes} pixels), planned for a gallery of {gallery_size:,} "
            "images."
        )


def upgrade_blocks(
    name: str,
    plan: UpgradePlan,
    models: list[AdoptedModelFacts],
    sample: SampleFacts,
    next_commands: list[str],
) -> list[Block]:
    """The report's blocks: the plan first, then what it was measured on."""
    recommended = plan.recommendation
    blocks: list[Block] = [
        Heading(f"Your upgrade: {name}", 2),
        Paragraph(
            f"**Recommended: {recommended.option}.** {recommended.reason} From "
            f"{models[0].name} to {models[1].name}; {sample.sentence(plan.gallery_size)}"
        ),
        Paragraph(plan.measured_on()),
        Table(plan.table_columns(), plan.table_cells()),
        *(Paragraph(line) for line in plan.timing_lines()),
        Heading("The models", 3),
        Table(
            [
                "role",
                "adopted as",
                "source kind",
                "file",
                "embedding from",
                "dimension",
                "runs on images",
            ],
            [model.row() for model in models],
        ),
    ]
    notes = [f"{row.option}: {row.note}" for row in plan.rows if row.note]
    if notes:
        blocks += [Heading("Notes", 3), BulletList(notes)]
    if next_commands:
        blocks += [
            Heading("Carrying it out", 3),
            Paragraph("The commands `modelupgrade plan` printed for this recommendation:"),
            CodeBlock("\n".join(next_commands)),
        ]
    return blocks


def write_upgrade_report(out: Path, name: str, blocks: list[Block]) -> list[Path]:
    """report.md and report.html in ``out``, written whole or not at all."""
    title = f"Upgrade {name}"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        write_text(tmp / REPORT_MARKDOWN, render_markdown(title, blocks))
        write_text(tmp / REPORT_HTML, render_html(title, blocks))
    return [out / REPORT_MARKDOWN, out / REPORT_HTML]
