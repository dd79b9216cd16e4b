"""Errors Ditto reports to users (the CLI prints the message and exits with code 1)."""


class DittoError(Exception):
    """A user-facing error: the message names the file (or tensor) and the problem."""


class OptionValueError(DittoError):
    """A command-line value outside what its input allows, known only once the input is read
    (``ditto serve --ctx`` past the model's max_seq_len). ``option`` names the flag; the CLI
    reports it as a usage error (exit 2), an API caller sees ``"OPTION: MESSAGE"``."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


class PluginError(DittoError):
    """A plugin problem: duplicate component names, unknown component, bad registration."""
