"""Scaling out on an existing engine: ``modelupgrade.scale.ray_backfill``, the gallery store's
backfill with its chunks computed by a pool of Ray Data workers (``pip install .[scale]``).
Data-parallel training under torchrun is beside the training engine
(``modelupgrade.training.distributed``).

Nothing is imported here, so that the default install never loads Ray.
"""
