"""Scaling out on existing engines: data-parallel training under torchrun, backfills on Ray Data.

- ``modelupgrade.scale.distributed``: what the training engine needs to run as one of N torchrun
  processes (DDP, sharded batches, gathered negatives, rank-0 duties); the identity in one process.
- ``modelupgrade.scale.ray_backfill``: the gallery store's backfill with its chunks computed by a
  pool of Ray Data workers (``pip install .[scale]``).

Nothing is imported here, so that the default install never loads torch.distributed or Ray.
"""
