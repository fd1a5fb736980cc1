import sys

from .cli.main import entry

sys.exit(entry())
