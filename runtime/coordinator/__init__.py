"""The coordinator core shared by training (runtime/learner) and evaluation (runtime/evaluation): one lease machine
(leases.py), one journal (journal.py), the evaluation ledger (ledger.py) and one HTTP server (server.py)."""
