"""The one exception type for bad user input."""


class BebopError(Exception):
    """An error caused by user input (a file, a flag, a config): the CLI prints one line and exits 2."""
