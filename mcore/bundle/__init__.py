"""Bundles: the build flow, the integrity-checked container, its manifest and its contents."""
