"""User-facing errors: one line naming what is wrong and what to do; the CLI exits 2."""

# C0, DEL and C1 controls (ESC, CSI, OSC, BEL, CR, VT, FF, NEL...) and the Unicode line separators
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def first_few(names: list[str], n: int = 3) -> str:
    """The first `n` names for a one-line message, "…" where there are more."""
    return ", ".join(names[:n]) + (", …" if len(names) > n else "")


def printable(text: str) -> str:
    """`text` with control characters shown escaped (\\xNN): a name from someone else's file must
    not move the cursor, recolour or retitle the terminal, or break a one-line message. Lone
    surrogates (bytes that are not UTF-8, or a JSON "\\ud800") are shown escaped too: they cannot be
    written to a UTF-8 terminal."""
    text = str(text).translate(_CONTROL)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class UserError(Exception):
    """A usage or input error. The message is one line, shown without a traceback."""

    exit_code = 2

    def __init__(self, message: str):
        # one line whatever a file put in the names it quotes: newlines become spaces, other line
        # breaks and terminal control characters are shown escaped
        super().__init__(printable(message.replace("\n", " ")).strip())


class RegionError(UserError):
    """A region rule (DESIGN.md §4) failed; `rule` names it and `subject` the node or tensor at fault."""

    def __init__(self, rule: str, subject: str | None, message: str):
        self.rule = rule
        self.subject = subject
        super().__init__(message)


class Cancelled(Exception):
    """Long work was cancelled through a CancelToken."""
