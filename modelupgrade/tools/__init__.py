"""Checks of the project's own code, run by its tests and by developers: the import graph
(``imports``), the DVC stages' code dependencies derived from it (``dvc_deps``) and the size of
functions and files (``code_size``). Only the ``closures`` stage's command
(``modelupgrade.commands.closures``) imports this package in the library."""
