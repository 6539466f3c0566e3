"""params.yaml: ``upgrades``, a team's own upgrades that ``dvc repro`` plans and reports.

Each entry names two models of ``adopted`` (the production model the gallery's vectors come from and
the candidate), a labelled sample of the team's images and the size of its gallery; dvc.yaml's
``upgrade@<name>`` stage adopts both, plans the upgrade and writes its report. Everything an entry
reads lies under its ``inputs`` directory, which the stage depends on: change a model file, an image
or a table there and ``dvc repro`` plans again; change another entry and this one stays as it is.
"""

from __future__ import annotations

from pydantic import Field

from modelupgrade.config.base import Section


class UpgradeParams(Section):
    """One upgrade: ``old`` and ``new`` are entries of ``adopted``; ``sample`` (and ``query`` with
    ``gallery``) are tables of item_id, label and path as ``modelupgrade plan`` takes them; paths
    are relative to the project's root, each under ``inputs``."""

    old: str
    new: str
    inputs: str
    sample: str
    query: str | None = None
    gallery: str | None = None
    gallery_size: int = Field(gt=0)
    tolerance_pct: float = Field(default=5.0, ge=0.0, lt=100.0)
    fit_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    # What the images are, in the team's words: the report says it where the study says "28×28".
    description: str = ""

    def files(self) -> dict[str, str]:
        """The tables the upgrade reads, by what they are."""
        named = {"sample": self.sample, "query": self.query, "gallery": self.gallery}
        return {role: path for role, path in named.items() if path is not None}
