"""The graph IR: the snapshot contract (DESIGN.md §1), op categories and the display helpers.

Nothing here knows a model family; capturing a role graph, which does, is mcore/graph/capture.py.
"""
