"""Monitoring: loss and gradient-norm monitors on robust statistics, kept on the device."""

__all__: list[str] = []
