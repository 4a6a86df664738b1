"""Acceptance of an EAGLE-3 drafter measured inside serving engines (vLLM, SGLang), side by side.

Modules: ``sets`` (evaluation prompts), ``prom`` (Prometheus text), ``vllm_metrics`` and ``sglang`` (each engine's
counters and their conversion to one definition), ``checks`` (drafter/target fit), ``runner`` (send prompts, read
counters before and after), ``report`` (report.json / .md / .png and Grafana gauges). Definitions:
``docs/evaluation.md``.
"""
