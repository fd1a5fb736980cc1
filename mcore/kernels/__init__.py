"""Bringing a kernel: shipped kernel builds, exporter stubs, running exporters, DSO checks."""
