"""``python -m modelupgrade <command>``: the ``modelupgrade`` command where the package is not
installed, only its source tree is at hand (a lent GPU machine runs ``gpu-study`` so)."""

from modelupgrade.cli import main

main()
