"""The ``mocolab`` command: its parsers and subcommands (``commands``) and how it ends (``exiting``); the
range of every number it takes is ``config.flags``."""
