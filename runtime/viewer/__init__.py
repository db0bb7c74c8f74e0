"""`harnessrl view RUN_DIR`: a run directory's rollouts in the browser."""
