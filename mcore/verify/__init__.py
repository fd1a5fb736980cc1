"""The promotion gates (tokens, embeddings, perf, logits, reference), verdicts, the watch loop."""
