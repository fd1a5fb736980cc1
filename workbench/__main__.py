"""`python -m workbench`: the same as the `workbench` command (for checkouts without an install)."""

import sys

from .cli import main

sys.exit(main())
