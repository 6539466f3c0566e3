"""What a person, a DVC stage or a Prefect task runs: one typed function per command.

The ``modelupgrade`` command line and every ``stages/<name>.py`` module are derived from these
functions (``modelupgrade.cli``), and the flows call them directly, so a command means the same in
every front end.
"""
