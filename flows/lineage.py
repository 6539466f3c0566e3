"""Flow ``lineage``: sequential upgrades on growing data, then the compatibility matrix.

    python -m flows.lineage --generations 3 [--params params.yaml] [--work-dir runs/flows]

Runs upgrade cycles back to back (gen0 → gen1 → … → gen<N-1>, each a subflow ``upgrade`` on the next
slice of ``sequential.fractions``) until the chain has ``--generations`` registered generations, so a
run that stopped half way continues where it stopped; then publishes the lineage and the
compatibility matrix over all generations (``lineage-report`` and ``compatibility-matrix``). It
builds the same chain, in the same work directory and registered model, that the scheduled upgrade
flow then continues.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from prefect import flow

from flows.layout import load_settings
from flows.reports import publish_lineage_report
from flows.tasks import read_chain, with_retries
from flows.upgrade import upgrade
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.runtime import setup_logging

@flow(name="lineage")
def lineage(generations: int = 3, params_path: str = "params.yaml", work_dir: str | None = None) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    planned = len(settings.params.sequential.fractions)
    if not 1 <= generations <= planned:
        raise UserError(
            f"--generations must lie in 1..{planned}: sequential.fractions plans {planned} growing snapshots",
            hint="list one fraction per generation under sequential.fractions in params.yaml",
        )
    args = (str(settings.params_path), str(settings.work.root))
    chain = with_retries(read_chain, settings.params)(*args)
    for generation in range(chain["next_generation"], generations):
        cycle = upgrade(*args)
        if cycle["status"] != "registered" or cycle["generation"] != generation:
            raise UserError(f"the upgrade cycle for gen{generation} registered nothing: {cycle}")
    return with_retries(publish_lineage_report, settings.params)(*args)


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.lineage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=3, help="generations of the chain, gen0 included")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--work-dir", help="where the flows keep their files (default: flows.work_dir)")
    args = parser.parse_args(argv)
    setup_logging()
    result = lineage(args.generations, args.params, args.work_dir)
    print(result_text(result))


def result_text(result: dict[str, Any]) -> str:
    rows = result["lineage"]
    lines = [f"{result['registered_model']} ({result['tracking_uri']}): {len(rows)} versions"]
    lines += [f"  v{r['version']} {r['model']}  parent={r['parent']}  gates={r['gates']}  "
              f"compatible_with={r['compatible_with']}  aliases={r['aliases']}" for r in rows]
    compat = result["compatibility"]
    generations = compat["generations"]
    lines.append(f"compatibility matrix, {compat['metric']} (rows: query generation, columns: gallery generation):")
    lines.append("        " + "".join(f"{g:>8}" for g in generations))
    for row in compat["matrix"]:
        cells = "".join(f"{row[g]:8.4f}" if row[g] is not None else " " * 8 for g in generations)
        lines.append(f"  {row['query']:<6}{cells}")
    lines.append(f"report:  {result['report']}")
    lines.append(f"heatmap: {result['heatmap']}")
    lines.append(f"metrics: {result['metrics_dir']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
