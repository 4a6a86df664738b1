"""The target model: the embedded CPU default (prepare) and its vLLM server (serve)."""
