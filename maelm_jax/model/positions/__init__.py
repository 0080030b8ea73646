"""Where a token sits, as the model sees it: its document (segments) and its position in
attention (the T5 relative bias of the roberta backbone, the rotations and local window of
the modern one); all of them follow a token through the static-shape gathers."""
