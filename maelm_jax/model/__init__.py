"""The network and what is computed on it: layers, the masked LM, masking, loss, FLOPs."""
