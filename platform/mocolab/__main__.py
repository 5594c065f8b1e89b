"""``python -m mocolab``: the same command line as ``mocolab``."""

from .cli import entry

entry()
