"""The workbench screens: Model, Graph, Region, Kernel, Build, Verify, plus guide and dialogs."""
