"""workbench: a Textual TUI over mcore, with recorded sessions and headless replay.

Talks to mcore only through its public API; every step is an action (workbench.actions)
so it can be recorded into a session (workbench.session) and replayed (workbench.replay).
"""

__version__ = "0.1.0"
