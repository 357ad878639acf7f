"""Skipping a step: an optimizer step skipped on the device, and all it must leave alone."""

__all__: list[str] = []
