"""Stage: the study report (markdown, HTML and the plots it shows) from the evaluation outputs.

    python -m stages.report --params params.yaml --out reports/study

Every option: ``python -m stages.report --help`` (``modelupgrade.commands.report.report``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.report import report

main = stage_main(report)

if __name__ == "__main__":
    main()
