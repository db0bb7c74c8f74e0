"""The programs that run on one machine, outside the cluster: `harnessrl run` (run.py, with supervisor.py and
live.py; it realises an operator Plan as local processes), `harnessrl eval` (evaluate.py), `harnessrl report`
(report.py), `harnessrl tiny-model` (tiny_model.py) and install_clis.py (the pinned harness CLIs into .tools,
as `make tools` runs it). No component image needs them."""
