"""Stage: build the demo gallery store and backfill it with the new model to completion.

    python -m stages.demo_store --params params.yaml \
        --old-model models/extended-data/gen0 --new-model models/extended-data/gen1-dmu \
        --gallery data/splits/extended-data/gallery.parquet \
        --old-embeddings embeddings/extended-data/gen0/gallery.npy --out stores/demo
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.store import demo_store

main = stage_main(demo_store)

if __name__ == "__main__":
    main()
