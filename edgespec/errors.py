"""The one exception type for errors a user can cause (bad file, mismatched pair, bad option)."""


class EdgespecError(Exception):
    """A user-facing error: the message says what went wrong and what to do.

    The CLI prints it on one line without a traceback and exits non-zero.
    """
