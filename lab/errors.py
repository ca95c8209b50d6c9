"""The one error type the lab raises for bad input or a failed step (printed on one line)."""


class LabError(RuntimeError):
    """Something the user can act on: the message names what is wrong."""
