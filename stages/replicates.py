"""Stage: the study's claims again at further training seeds (params.yaml replicates).

    python -m stages.replicates --params params.yaml --out replicates

Every option: ``python -m stages.replicates --help``
(``modelupgrade.commands.replicates.replicates``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.replicates import replicates

main = stage_main(replicates)

if __name__ == "__main__":
    main()
