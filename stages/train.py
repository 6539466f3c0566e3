"""Stage: train one embedding model (generation 0, or a new generation under a strategy).

    python -m stages.train --params params.yaml --scenario extended-data --generation 0 \
        --out models/extended-data/gen0
    python -m stages.train --params params.yaml --scenario extended-data --generation 1 \
        --strategy bct --old models/extended-data/gen0 --out models/extended-data/gen1-bct \
        --embed-dir embeddings/extended-data/gen1-bct \
        --embed-split data/splits/extended-data/query.parquet \
            data/splits/extended-data/gallery.parquet
    python -m stages.train --params params.yaml --generation 2 --strategy bct \
        --split data/splits/sequential/gen2.parquet --old models/sequential/bct/gen1 \
        --out models/sequential/bct/gen2

Every option: ``python -m stages.train --help`` (``modelupgrade.commands.training.train``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.training import train

main = stage_main(train)

if __name__ == "__main__":
    main()
