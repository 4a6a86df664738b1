"""Training data: records -> chat-template rendering -> loss masks -> token-exact validation -> packed
samples and the draft vocabulary. Rules in docs/data.md; on-disk layout in docs/formats.md §3."""
