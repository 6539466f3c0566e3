"""modelupgrade: compatible embedding-model upgrades, transformation heads
and online backfilling."""

__version__ = "0.1.0"
