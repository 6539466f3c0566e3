"""Stage: scan the configured dataset into its manifest (one table for any format).

    python -m stages.prepare --params params.yaml --out data/manifests/fashion-mnist.parquet

Every option: ``python -m stages.prepare --help`` (``modelupgrade.commands.data.prepare``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.data import prepare

main = stage_main(prepare)

if __name__ == "__main__":
    main()
