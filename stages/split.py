"""Stage: cut the manifest into a scenario's splits, or into sequential growing snapshots.

    python -m stages.split --params params.yaml --manifest data/manifests/fashion-mnist.parquet \
        --scenario extended-data --out data/splits/extended-data
    python -m stages.split --params params.yaml --manifest data/manifests/fashion-mnist.parquet \
        --sequential --out data/splits/sequential

Every option: ``python -m stages.split --help`` (``modelupgrade.commands.data.split``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.data import split

main = stage_main(split)

if __name__ == "__main__":
    main()
