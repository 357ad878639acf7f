"""Checkpointing: all-or-nothing checkpoints of a run, random state and data position included."""

__all__: list[str] = []
