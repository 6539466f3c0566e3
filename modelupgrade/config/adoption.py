"""params.yaml: ``adopted``, models made elsewhere that ``modelupgrade adopt`` brings in."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from modelupgrade.config.base import Section


class AdoptionParams(Section):
    """One model made elsewhere: its registered source ``kind`` (``timm``, ``torchvision``,
    ``torchscript``, ``embeddings``) and that kind's options (the ``Options`` class of each source
    in ``modelupgrade.models.adopted``; ``modelupgrade.params`` checks both)."""

    kind: str
    options: dict[str, Any] = Field(default_factory=dict)
