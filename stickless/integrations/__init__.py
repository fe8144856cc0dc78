"""Adapters that run an agent framework's agents as stickless live sessions: each lives in a
module of its own, imported only when used (its framework is an extra)."""
