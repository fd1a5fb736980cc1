"""Graph capture (torch.export) and the snapshot contract (DESIGN.md §1)."""
