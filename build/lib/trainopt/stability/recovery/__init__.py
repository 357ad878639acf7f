"""Recovery: roll back to a checkpoint and lower the learning rate, a cut the schedule keeps."""

__all__: list[str] = []
