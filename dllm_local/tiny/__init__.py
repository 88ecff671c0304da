"""The embedded tiny models: their synthetic task suite, tokenizer and training."""
