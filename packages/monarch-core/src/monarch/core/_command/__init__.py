"""The ``monarch`` command and its terminal-only subcommands: nothing here imports the
runtime at module level, since every invocation loads every subcommand."""
