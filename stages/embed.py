"""Stage: embed the images of one or more split files with a trained model.

    python -m stages.embed --params params.yaml --model models/extended-data/gen1-bct \
        --split data/splits/extended-data/query.parquet data/splits/extended-data/gallery.parquet \
        --out-dir embeddings/extended-data/gen1-bct

Every option: ``python -m stages.embed --help`` (``modelupgrade.commands.training.embed``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.training import embed

main = stage_main(embed)

if __name__ == "__main__":
    main()
