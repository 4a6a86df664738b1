"""Generation: regenerate answers to prompts with the target through an rq worker pool."""
