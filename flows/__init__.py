"""Prefect flows that sequence the steps of an upgrade chain (``modelupgrade.chain``, which runs the
commands of ``modelupgrade.commands``; never shelling out to DVC).

``upgrade`` (one upgrade cycle), ``lineage`` (upgrades back to back, then the compatibility matrix),
``backfill`` (keep the gallery store on the champion) and ``train-generation`` (the cycle's GPU
part); ``python -m flows.serve`` serves ``upgrade`` and ``backfill`` on their cron schedules. A flow
module holds flows, tasks (each one call into the library) and its ``main`` only; the library
``modelupgrade`` never imports this package.
"""

import os

# The temporary server that a plain `python -m flows.<name>` starts would send Prefect's usage
# telemetry, and on its SQLite database it fails doing so with "database is locked" tracebacks in
# the flow's output. A setting of the user's own wins.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
