"""harnessrl.runtime: the programs that run in the pods. Never imports harnessrl.operator."""
