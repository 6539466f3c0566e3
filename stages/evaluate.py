"""Stage: cross-model retrieval evaluation of one scenario (matrix, heatmap, Δ↑ / Δ↓ / flips).

    python -m stages.evaluate --params params.yaml --scenario extended-data
    python -m stages.evaluate --params params.yaml --scenario sequential --strategies bct

Every option: ``python -m stages.evaluate --help`` (``modelupgrade.commands.evaluation.evaluate``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.evaluation import evaluate

main = stage_main(evaluate)

if __name__ == "__main__":
    main()
