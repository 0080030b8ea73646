"""HuggingFace/PyTorch: the converted weights, the model class and the tokenizer."""
