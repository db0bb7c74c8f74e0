"""Evaluation: pass@1 of one policy under each harness pool, served to unmodified runners over the learner's
lease/complete protocol (runtime/contracts/coordinator.py)."""
