"""Flow ``lineage``: sequential upgrades on growing data, then the compatibility matrix.

    python -m flows.lineage --generations 3 [--params params.yaml] [--work-dir runs/flows] [--json]

Runs upgrade cycles back to back (gen0 → gen1 → … → gen<N-1>, each a subflow ``upgrade`` on the
next slice of ``sequential.fractions``) until the chain has ``--generations`` registered
generations, so a run that stopped half way continues where it stopped; then publishes the lineage
and the compatibility matrix over all generations (``lineage-report`` and
``compatibility-matrix``). It builds the same chain, in the same work directory and registered
model, that the scheduled upgrade flow then continues.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.reports import publish_lineage_report
from flows.tasks import read_chain
from flows.upgrade import upgrade
from modelupgrade.chain import load_chain
from modelupgrade.cli.arguments import stage_main
from modelupgrade.config import DEFAULT_PARAMS_FILE, ParamsFile
from modelupgrade.errors import UserError
from modelupgrade.orchestration import with_retries
from modelupgrade.report.upgrade import LineageOutcome


@flow(name="lineage")
def lineage(
    generations: int = 3,
    params_path: ParamsFile = DEFAULT_PARAMS_FILE,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """Upgrade cycles back to back until the chain has its generations, then its lineage and
    compatibility matrix.

    Args:
        generations: generations of the chain, gen0 included
        params_path: the params file
        work_dir: where the flows keep their files (default: flows.work_dir)
    """
    chain = load_chain(params_path, work_dir)
    chain.check_length(generations)
    state = with_retries(read_chain, chain.params)(*chain.reference)
    for generation in range(state["next_generation"], generations):
        cycle = upgrade(*chain.reference)
        if cycle["status"] != "registered" or cycle["generation"] != generation:
            raise UserError(f"the upgrade cycle for gen{generation} registered nothing: {cycle}")
    return with_retries(publish_lineage_report, chain.params)(*chain.reference)


main = stage_main(lineage, LineageOutcome)

if __name__ == "__main__":
    main()
