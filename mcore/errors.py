"""User-facing errors: one line naming what is wrong and what to do; the CLI exits 2."""


class UserError(Exception):
    """A usage or input error. The message is one line, shown without a traceback."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message.replace("\n", " ").strip())


class Cancelled(Exception):
    """Long work was cancelled through a CancelToken."""
