"""Stage: write each stage's code closure (every file it runs, with its hash) under closures/.

    python -m stages.closures --out closures

Every option: ``python -m stages.closures --help`` (``modelupgrade.commands.closures.closures``).
"""

from modelupgrade.cli.arguments import stage_main
from modelupgrade.commands.closures import closures

main = stage_main(closures)

if __name__ == "__main__":
    main()
