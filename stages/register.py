"""Stage: register a scenario's generations in the MLflow model registry, gate them, set aliases.

    python -m stages.register --params params.yaml --scenario extended-data \
        --out registry/extended-data.json
    python -m stages.register --params params.yaml --scenario sequential \
        --out registry/sequential.json

Every option: ``python -m stages.register --help`` (``modelupgrade.commands.registry.register``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.registry import register

main = stage_main(register)

if __name__ == "__main__":
    main()
