"""Loss scaling: the dynamic loss scaler for fp16, with the ``torch.amp.GradScaler`` interface."""

__all__: list[str] = []
