"""harnessrl: reinforcement learning for coding agents inside the harnesses people really use."""

__version__ = "0.1.0"
