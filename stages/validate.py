"""Stage: validate the manifest and split directories with Great Expectations; stop on bad data.

    python -m stages.validate --params params.yaml \
        --manifest data/manifests/fashion-mnist.parquet \
        --splits data/splits/extended-data data/splits/sequential --out-dir data/validation
    python -m stages.validate --params params.yaml \
        --manifest data/manifests/fashion-mnist.parquet --splits-root data/splits

Every option: ``python -m stages.validate --help`` (``modelupgrade.commands.data.validate``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.data import validate

main = stage_main(validate)

if __name__ == "__main__":
    main()
