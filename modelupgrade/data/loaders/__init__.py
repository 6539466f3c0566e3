"""Dataset loaders, one class per format, selected by ``dataset.loader`` in params.yaml."""

from modelupgrade.data.loaders import cifar100, gldv2, idx, imagefolder, manifest_file  # noqa: F401
from modelupgrade.data.loaders.base import LOADERS, DatasetLoader, build_loader

__all__ = ["LOADERS", "DatasetLoader", "build_loader"]
