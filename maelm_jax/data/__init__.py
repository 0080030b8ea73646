"""Text to token blocks: documents, the tokenizer, packing, batches, prepared corpora."""
