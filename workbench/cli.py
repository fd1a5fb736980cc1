"""`workbench`: the TUI, its guided tutorials, and session replay (headless for CI).

    workbench [--workdir DIR]                   open the workbench TUI (free exploration; its artifacts go
                                                to DIR, else a fresh artifacts/workbench-* folder)
    workbench tutorial [NAME]                   guided tutorial (default qwen-recipe)
    workbench tutorial --list                   names and titles of the shipped tutorials
    workbench replay FILE                       replay a session in the TUI
    workbench replay FILE --headless [--workdir DIR] [--trust-libraries DIR]
                                                replay without a screen; prints a table of every step
                                                and a headline of steps matched and gate verdicts;
                                                stops at the first failing step (--keep-going: not)
                                                exit 0 PASS: all matched and every gate passed;
                                                1 FAIL: a difference (a changed gate verdict too);
                                                3 REPRODUCED: all matched, and a gate failed (or was
                                                INCONCLUSIVE) as recorded; 2 bad input
                                                a session's paths must stay inside the workdir; a
                                                step that loads a DSO needs --trust-libraries DIR
                                                (a folder inside the workdir, e.g. `.`)

User errors print one line and exit 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mcore import Cancelled, UserError

PROG = "workbench"
DEFAULT_TUTORIAL = "qwen-recipe"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2)."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def make_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = Parser(
        prog=PROG,
        usage="%(prog)s [--workdir DIR] | %(prog)s tutorial [NAME] | %(prog)s replay FILE [--headless]",
        description="Bring your own kernel into a model's graph: the guided TUI, saved sessions and replay.\n\n"
        "  workbench                 free exploration in a fresh artifacts/workbench-* folder\n"
        "  workbench --workdir DIR   free exploration with its artifacts in DIR\n"
        "  workbench tutorial [NAME] a guided tutorial (--list names them)\n"
        "  workbench replay FILE     a saved session, step by step (--headless for a table)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"workbench {__version__}")
    p.add_argument(
        "--workdir",
        dest="free_workdir",
        metavar="DIR",
        default=None,
        help="plain `workbench`: the folder for its artifacts (created if missing; default: a fresh "
        "artifacts/workbench-* folder)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    t = sub.add_parser(
        "tutorial", prog=f"{PROG} tutorial", help="open a guided tutorial in the TUI (default qwen-recipe)"
    )
    t.add_argument("name", nargs="?", default=None, help="tutorial name (see --list)")
    t.add_argument("--list", action="store_true", help="print the tutorial names and titles")
    t.add_argument("--workdir", default=None, help="folder for the tutorial's artifacts (default: a fresh one)")
    t.set_defaults(func=cmd_tutorial)

    r = sub.add_parser("replay", prog=f"{PROG} replay", help="re-run a saved session and compare its recorded results")
    r.add_argument("file", help="session JSON file")
    r.add_argument(
        "--headless",
        action="store_true",
        help="no screen: print a table; exit 0 PASS, 1 a difference, 3 a recorded failure reproduced",
    )
    r.add_argument(
        "--keep-going",
        action="store_true",
        help="headless: run every step even after one fails (default: stop at the first)",
    )
    r.add_argument(
        "--workdir",
        default=None,
        help="new or empty folder for the replayed artifacts (default: a temporary folder; "
        "with --headless it is removed after)",
    )
    r.add_argument(
        "--trust-libraries",
        metavar="DIR",
        default=None,
        help="headless: load the DSOs the session's bindings name only from DIR, a folder inside "
        "the workdir (relative to it; `.` trusts every library the session builds); "
        "without it a step that would load native code is refused",
    )
    r.set_defaults(func=cmd_replay)
    return p


def _run_app(**kw) -> int:
    try:
        from .app import run_app
    except ImportError as e:
        raise UserError(
            f"the workbench TUI is not available in this build ({e}); use `workbench replay FILE --headless`"
        ) from None
    rc = run_app(**kw)
    return int(rc or 0)


def cmd_tutorial(ns: argparse.Namespace) -> int:
    from .session import find_tutorial, list_tutorials

    if ns.list:
        if ns.name:
            raise UserError("give either a tutorial name or --list, not both")
        rows = list_tutorials()
        w = max([len("NAME")] + [len(n) for n, _, _ in rows]) + 2
        print(f"{'NAME':<{w}}TITLE")
        for name, title, _ in rows:
            print(f"{name:<{w}}{title}")
        return 0
    name = ns.name or DEFAULT_TUTORIAL
    find_tutorial(name)  # one-line error for an unknown name before any screen opens
    return _run_app(tutorial=name, **({"workdir": ns.workdir} if ns.workdir else {}))


def cmd_replay(ns: argparse.Namespace) -> int:
    from .session import Session

    session = Session.load(ns.file)  # bad input: one line, exit 2, before anything runs
    if ns.workdir:
        from .replay import require_empty_workdir

        require_empty_workdir(Path(ns.workdir).expanduser())  # the TUI refuses a used folder too
    if not ns.headless:
        if ns.keep_going:
            raise UserError("--keep-going is for --headless; in the TUI every step waits for n")
        if ns.trust_libraries:
            raise UserError("--trust-libraries is for --headless; the TUI asks before it loads a library")
        return _run_app(replay=str(ns.file), **({"workdir": ns.workdir} if ns.workdir else {}))
    return headless_replay(session, ns.workdir, keep_going=ns.keep_going, trust_libraries=ns.trust_libraries)


def headless_replay(session, workdir: str | None, keep_going: bool = False, trust_libraries: str | None = None) -> int:
    from .replay import replay

    temp = None
    if workdir is None:
        temp = tempfile.mkdtemp(prefix="workbench-replay-")
        wd = Path(temp)
    else:
        wd = Path(workdir)
    n = len(session.steps)

    def on_step(i, step, outcome) -> None:
        if outcome is None:
            print(f"[{i}/{n}] {step.action} ...", file=sys.stderr, flush=True)

    try:
        report = replay(
            session,
            wd,
            on_step=on_step,
            keep_going=keep_going,
            trust_libraries=trust_libraries,
            log=lambda line: print(f"    {line}", file=sys.stderr, flush=True),
        )
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    width = shutil.get_terminal_size((160, 24)).columns if sys.stdout.isatty() else 160
    print(report.render_table(width=max(80, width)))
    print(report.summary())
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    from mcore import check_std_streams

    closed = check_std_streams(PROG)
    if closed is not None:
        return closed
    parser = make_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command is None:
            return _run_app(**({"workdir": ns.free_workdir} if ns.free_workdir else {}))
        if ns.free_workdir:
            if getattr(ns, "workdir", None):
                raise UserError("--workdir is given twice; give it once, after the command")
            ns.workdir = ns.free_workdir
        rc = int(ns.func(ns) or 0)
        sys.stdout.flush()  # a full disk or closed stdout shows here, as one line
        return rc
    except BrokenPipeError:  # `workbench replay ... | head`: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        from mcore import stdout_failed

        return stdout_failed(PROG, e)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.exit_code
    except Cancelled:
        print(f"{PROG}: cancelled", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
