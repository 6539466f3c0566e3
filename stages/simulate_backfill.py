"""Stage: simulate online backfilling for one scenario: every (strategy, policy, mode) curve.

    python -m stages.simulate_backfill --params params.yaml --scenario extended-data
    python -m stages.simulate_backfill --params params.yaml --scenario extended-data \
        --old embeddings/extended-data/gen0 \
        --variant bct=embeddings/extended-data/gen1-bct \
            fastfill=embeddings/extended-data/gen1-independent \
        --array fastfill:forward_gallery=embeddings/extended-data/fastfill-independent/gallery.npy \
        --old-logits embeddings/extended-data/gen0/gallery_logits.npy

Every option: ``python -m stages.simulate_backfill --help``
(``modelupgrade.commands.backfill.simulate_backfill``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.backfill import simulate_backfill

main = stage_main(simulate_backfill)

if __name__ == "__main__":
    main()
