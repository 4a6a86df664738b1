"""Extraction: the target's hidden states as EAGLE-3 training features (stored or streamed)."""
