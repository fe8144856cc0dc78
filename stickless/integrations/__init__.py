"""Adapters that run an agent framework behind stickless (each needs its own extra installed)."""
