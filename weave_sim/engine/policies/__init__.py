"""Scheduling policies: one module each, registered by name in `registry`."""
from .registry import POLICIES, parse_policy, policy_names

__all__ = ["POLICIES", "parse_policy", "policy_names"]
