"""Prefect flows that sequence the stages' ``run(...)`` functions (never shelling out to DVC).

``upgrade`` (one upgrade cycle), ``lineage`` (upgrades back to back, then the compatibility matrix),
``backfill`` (keep the gallery store on the champion) and ``train-generation`` (the cycle's GPU
part); ``python -m flows.serve`` serves ``upgrade`` and ``backfill`` on their cron schedules. The
library ``modelupgrade`` never imports this package.
"""
