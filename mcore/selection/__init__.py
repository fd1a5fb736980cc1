"""Selecting a region: the one validator, receipts and their ABI, recipes, build-time checks."""
