"""The local programs: `harnessrl run` (run.py, with its supervisor and live view), `harnessrl eval`
(evaluate.py), `harnessrl report` (report.py) and `harnessrl tiny-model` (tiny_model.py). They realise an
operator Plan as processes on this machine instead of Kubernetes objects."""
