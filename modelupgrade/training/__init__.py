"""The training engine and the one-call ``train_model`` used by the train stage."""

from modelupgrade.schedule import learning_rate
from modelupgrade.training.augment import BatchAugment
from modelupgrade.training.engine import (
    RESUME_FILE,
    Trainer,
    TrainingDivergedError,
    TrainingResult,
    place_images,
)
from modelupgrade.training.pipeline import build_model, default_resume_dir, train_model

__all__ = [
    "RESUME_FILE",
    "BatchAugment",
    "Trainer",
    "TrainingDivergedError",
    "TrainingResult",
    "build_model",
    "default_resume_dir",
    "learning_rate",
    "place_images",
    "train_model",
]
