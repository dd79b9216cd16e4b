"""Errors Ditto reports to users (the CLI prints the message and exits with code 1)."""


class DittoError(Exception):
    """A user-facing error: the message names the file (or tensor) and the problem."""


class PluginError(DittoError):
    """A plugin problem: duplicate component names, unknown component, bad registration."""
