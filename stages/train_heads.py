"""Stage: train one transformation head on cached embeddings and save it with its card.

    python -m stages.train_heads --params params.yaml --head bict \
        --old-embeddings embeddings/extended-data/gen0/new_train.npy \
        --new-embeddings embeddings/extended-data/gen1-bct/new_train.npy \
        --labels data/splits/extended-data/new_train.parquet \
        --new-model models/extended-data/gen1-bct --out heads/extended-data/bict-bct \
        --outputs-dir embeddings/extended-data/bict-bct \
        --evaluation-old embeddings/extended-data/gen0 \
        --evaluation-new embeddings/extended-data/gen1-bct

Every option: ``python -m stages.train_heads --help`` (``modelupgrade.commands.heads.train_heads``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.heads import train_heads

main = stage_main(train_heads)

if __name__ == "__main__":
    main()
