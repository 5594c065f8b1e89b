"""``python -m mocolab``: the same command line as ``mocolab``."""

from mocolab.cli.commands import entry

entry()
