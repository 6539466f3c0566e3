"""Stage: fit the training-free adapters of params.yaml's adapters section at every sample size.

    python -m stages.fit_adapters --params params.yaml --scenario extended-data

Every option: ``python -m stages.fit_adapters --help``
(``modelupgrade.commands.heads.fit_adapters``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.heads import fit_adapters

main = stage_main(fit_adapters)

if __name__ == "__main__":
    main()
