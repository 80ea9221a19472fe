"""Drift attribution: which operator boundary of the chain makes a trainer's log-probs differ from an inference
engine's, how far, how it grows through the layers, and what it does to the RL loss.

A train-style role and an inference-style role (profile x layout) run the Qwen3-shaped chain of gradsweep.nn on
the same logical tokens; every boundary is restored to logical order and compared (bits, then magnitudes);
each differing boundary's effect on the final logp of loss-carrying tokens is measured by substitution; the RL
loss fragments are the last boundaries. Bitwise claims (same profile) and tolerance-based cross-backend parity
(different profiles) are reported apart.
"""

from gradsweep.drift.api import SCHEMA, DriftPlan, run_drift_plan
from gradsweep.drift.boundaries import Boundary, chain_boundaries
from gradsweep.drift.plan import BITWISE, PARITY, Pair, Role, default_pairs, profile_state

__all__ = ["BITWISE", "PARITY", "SCHEMA", "Boundary", "DriftPlan", "Pair", "Role", "chain_boundaries",
           "default_pairs", "profile_state", "run_drift_plan"]
