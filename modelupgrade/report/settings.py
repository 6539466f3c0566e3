"""Where the study's settings differ from the papers', and why: the report's "Settings against the
papers" table.

Each entry names a setting, the papers' value with its source, and reads ours from the params; a
row is shown only where ours differs, so the full-size study (params/gpu-full.yaml) lists fewer.
The reasons are the CPU budget's: ``make repro`` trains everything on two cores in 15 minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from modelupgrade.config import ArchitectureParams, Params
from modelupgrade.heads import HEADS
from modelupgrade.heads.training import resolve_training

# The scenario kind whose upgrade is the model alone (same data).
IDENTICAL_DATA = "identical-data"
# The papers' own backbones: ResNet-50 (BiCT, DMU, FCT, FastFill), ResNet-18 → ResNet-50 (UniBCT).
PAPER_BACKBONES = ("resnet18", "resnet50")
PAPER_EPOCHS = 30
UNIBCT_WARMUP_EPOCHS = 10
DMU_HEAD_WIDTH = 1024


@dataclass(frozen=True)
class SettingRow:
    """One setting where the study departs from the papers."""

    setting: str
    paper: str
    ours: str
    reason: str


@dataclass(frozen=True)
class PaperSetting:
    """A setting the papers fix. ``ours`` reads the study's value from the params, or None where
    it is the papers' (or the setting does not apply)."""

    setting: str
    paper: str
    reason: str
    ours: Callable[[Params], str | None]

    def row(self, params: Params) -> SettingRow | None:
        ours = self.ours(params)
        return None if ours is None else SettingRow(self.setting, self.paper, ours, self.reason)


def _dataset(params: Params) -> str | None:
    if params.dataset.loader == "gldv2":
        return None
    cap = params.dataset.max_train_per_class
    kept = "every training image" if cap is None else f"{cap} training images per class"
    return f"{params.dataset.name}, {kept}"


def _architecture(arch: ArchitectureParams) -> str:
    widths = arch.backbone_kwargs.get("channels")
    width = f" (stage widths {'/'.join(map(str, widths))})" if widths else ""
    return f"{arch.backbone}{width}, {arch.embedding_dim}-d"


def _backbones(params: Params) -> str | None:
    used = [
        params.architectures[name]
        for scenario in params.studied.values()
        for name in (scenario.old_architecture, scenario.new_architecture)
    ]
    if all(arch.backbone in PAPER_BACKBONES for arch in used):
        return None
    return "; ".join(dict.fromkeys(_architecture(arch) for arch in used))


def _training_length(params: Params) -> str | None:
    training = params.training
    if training.steps is None:
        return None if training.epochs >= PAPER_EPOCHS else f"{training.epochs} epochs"
    seen = training.steps * training.batch_size
    return (
        f"{training.steps} SGD steps of {training.batch_size} images for every model, old and "
        f"new alike ({seen:,} images seen: many epochs of a small old training set, fewer of "
        "the new one's)"
    )


def _unibct_warmup(params: Params) -> str | None:
    trained = {name for scenario in params.studied.values() for name in scenario.strategies}
    warmups = [
        (name, s.options.get("warmup_epochs"))
        for name, s in params.strategies.items()
        if s.kind == "unibct" and name in trained
    ]
    length = (
        f"{params.training.epochs} epochs"
        if params.training.steps is None
        else f"{params.training.steps} steps"
    )
    differing = [
        f"{name}: {warmup} epochs of {length}"
        for name, warmup in warmups
        if warmup is not None and warmup != UNIBCT_WARMUP_EPOCHS
    ]
    return "; ".join(differing) or None


def _dmu_width(params: Params) -> str | None:
    widths = [
        f"{name}: {s.options['head_hidden_dim']}"
        for name, s in params.strategies.items()
        if s.kind == "dmu" and s.options.get("head_hidden_dim", DMU_HEAD_WIDTH) != DMU_HEAD_WIDTH
    ]
    return "; ".join(widths) or None


def _heads(params: Params) -> str | None:
    """The heads whose width or length is not their paper's, grouped by what they use instead."""
    groups: dict[tuple[int, int], list[str]] = {}
    for name, head in params.heads.items():
        paper = HEADS.get(head.kind).TRAINING_DEFAULTS
        ours = resolve_training(head)
        if (ours.hidden_dim, ours.epochs) != (paper.hidden_dim, paper.epochs):
            groups.setdefault((ours.hidden_dim, ours.epochs), []).append(name)
    return (
        "; ".join(
            f"{', '.join(names)}: width {width}, {epochs} epochs"
            for (width, epochs), names in groups.items()
        )
        or None
    )


def _identical_data(params: Params) -> str | None:
    upgrades = []
    for scenario in params.studied.values():
        if scenario.kind != IDENTICAL_DATA:
            continue
        old = params.architectures[scenario.old_architecture]
        new = params.architectures[scenario.new_architecture]
        if (old.backbone, new.backbone) != PAPER_BACKBONES:
            upgrades.append(
                f"{scenario.old_architecture} → {scenario.new_architecture}: "
                f"{old.backbone} {old.classifier} → {new.backbone} {new.classifier}"
            )
    return "; ".join(upgrades) or None


def _evaluation(params: Params) -> str | None:
    if params.dataset.loader == "gldv2":
        return None
    split = params.evaluation_split
    gallery = "all" if split.gallery_per_class is None else split.gallery_per_class
    return (
        f"held-out {split.source_split} images of every class: {split.queries_per_class} "
        f"queries and {gallery} gallery images per class, {params.evaluation.headline_metric}"
    )


PAPER_SETTINGS: tuple[PaperSetting, ...] = (
    PaperSetting(
        "training data",
        "GLDv2 (1.58 M images, 81,313 classes: BiCT, DMU, UniBCT); ImageNet-1k (FCT, FastFill, "
        "Seo et al.)",
        "the embedded dataset the machine has; a CPU budget of 15 minutes for every model",
        _dataset,
    ),
    PaperSetting(
        "backbones",
        "ResNet-50 (BiCT, DMU, FCT, FastFill), ResNet-18 → ResNet-50 (UniBCT), 512-d",
        "seconds per epoch on a CPU core; 28×28 images",
        _backbones,
    ),
    PaperSetting(
        "training length",
        "30 epochs (BiCT App. A, DMU); 35 (UniBCT)",
        "the same number of steps for the old and the new model, enough for each to converge "
        "(the report's model table), within the CPU budget; the replicates' seeds take a share",
        _training_length,
    ),
    PaperSetting(
        "UniBCT warm-up",
        "10 of 35 epochs (UniBCT Alg. 1)",
        "scaled to the run's length",
        _unibct_warmup,
    ),
    PaperSetting(
        "DMU's jointly trained ψ",
        "3 × [fc-bn-relu] + fc, width 1024 (DMU)",
        "64-d embeddings and 3,000 training images",
        _dmu_width,
    ),
    PaperSetting(
        "transformation heads",
        "each kind's paper recipe (FCT/FastFill width 2048, 80 epochs; BiCT 4096, 30; DMU 1024, "
        "30; Seo et al. 2 blocks, 50 epochs)",
        "64-d embeddings and 3,000 training pairs",
        _heads,
    ),
    PaperSetting(
        "identical-data upgrade",
        "ResNet-18 → ResNet-50 on the same data (UniBCT Table 1)",
        "twice as wide on the same 900 images is no upgrade at this scale (M(new) − M(old) = "
        "−0.01 ± 0.09 over 3 seeds); BiCT's other identical-data setting, softmax → ArcFace "
        "(BiCT Table 5), is one",
        _identical_data,
    ),
    PaperSetting(
        "evaluation",
        "GLDv2-test mAP@100 and ROxford/RParis Medium mAP (BiCT, DMU, UniBCT); ImageNet "
        "validation queries against the validation gallery (FCT, FastFill, Seo et al.)",
        "Fashion-MNIST has no retrieval benchmark: the FCT / FastFill / Seo et al. protocol on "
        "its test images",
        _evaluation,
    ),
)


def settings_against_papers(params: Params) -> list[SettingRow]:
    """The settings of ``params`` that differ from the papers', in the table's order."""
    return [row for setting in PAPER_SETTINGS if (row := setting.row(params)) is not None]
