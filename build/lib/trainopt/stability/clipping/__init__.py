"""Clipping: gradient clipping by global norm, by the norm's history, and unit-wise."""

__all__: list[str] = []
