"""draftsmith."""
