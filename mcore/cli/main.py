"""Entry point: `mcore VERB ...`. User errors print one line and exit 2; no tracebacks."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from ..common.errors import Cancelled, UserError
from ..common.fileio import check_std_streams, stdout_failed

# Verb groups, each a module in mcore.cli with register(subparsers).
GROUPS = ("graph_cmds", "build_cmds", "kernel_cmds", "verify_cmds", "profile_cmds")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2)."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="mcore", description="Bring your own kernel into a model's inference graph (TVM-FFI).")
    from .. import __version__

    p.add_argument("--version", action="version", version=f"mcore {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    sub.required = True
    for name in GROUPS:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__package__}.{name}":
                continue  # verb group not present in this build
            raise
        mod.register(sub)
    return p


def main(argv: Sequence[str] | None = None, own_process: bool = False) -> int:
    closed = check_std_streams("mcore")
    if closed is not None:
        return closed
    parser = make_parser()
    if own_process:
        # The verbs' imports (torch's objects, most of them) live until the process exits: frozen, the
        # garbage collector no longer walks them on each full collection nor at exit (a CPU `mcore run`
        # of a demo bundle: 4.4 -> 3.7 s). Only in a process of its own: frozen objects are never
        # collected, which a long-lived caller of main() (the workbench, a test) must not inherit.
        gc.freeze()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a full disk or closed stdout shows here, as one line, not at exit
    except UserError as e:
        print(f"mcore: error: {e}", file=sys.stderr)
        return e.exit_code
    except Cancelled:
        print("mcore: cancelled", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("mcore: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `mcore graph list ... | head`: the reader went away; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        return stdout_failed("mcore", e)
    return int(rc or 0)


def entry() -> int:
    """The `mcore` command and `python -m mcore`: main() in a process of its own."""
    return main(own_process=True)


if __name__ == "__main__":
    sys.exit(entry())
