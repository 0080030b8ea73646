"""SQuAD 2.0 and 1.1 on an export: the official files read, the papers' windows and span
labels, answers decoded from start and end logits, and the official evaluation's scores."""
