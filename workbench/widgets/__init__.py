"""Reusable widgets of the workbench TUI."""
