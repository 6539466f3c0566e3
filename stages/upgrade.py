"""Stage: a team's own upgrade — adopt its two models, plan it, write the report the plan leads.

    python -m stages.upgrade --params params.yaml --name mine

Every option: ``python -m stages.upgrade --help`` (``modelupgrade.commands.upgrade.upgrade``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.upgrade import upgrade

main = stage_main(upgrade)

if __name__ == "__main__":
    main()
