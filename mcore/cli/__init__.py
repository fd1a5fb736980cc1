"""The mcore command line: one module per verb group, each with register(subparsers)."""
