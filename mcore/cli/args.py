"""Argument types shared by the verbs."""

from __future__ import annotations

import argparse


def path_arg(text: str) -> str:
    """A file path on the command line: an empty one (an unset shell variable, `--graph-patch "$SEL"`)
    is refused by argparse, never read as "." nor taken for a flag not given (a native bundle built)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty (an unset variable?); give one")
    return text
