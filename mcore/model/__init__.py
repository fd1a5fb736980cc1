"""What the user names and a checkpoint declares: build arguments, its tokenizer, its pooling."""
