"""Serving a trained drafter to live traffic: capture of served requests, the gateway in front of the engines, and
the canary that promotes a refreshed drafter or rolls it back (docs/serving.md)."""
