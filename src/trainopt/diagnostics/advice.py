"""The cause and the fix of each symptom that :func:`trainopt.diagnostics.diagnose` names."""

from __future__ import annotations

GUIDE = "guides/troubleshooting.md"


ADVICE: dict[str, tuple[str, str, str]] = {
    "nan_inf": (
        "an overflow (fp16 without loss scaling, a learning rate far too high) or a NaN in the data",
        "find the first bad step; scale fp16 losses with trainopt.stability.DynamicLossScaler, which "
        "skips steps whose gradients overflow; check the batch for NaN",
        f"{GUIDE}#nan-or-inf"),
    "loss_explosion": (
        "one or a few updates far too large: a learning-rate spike, a bad batch, no clipping",
        "clip with trainopt.stability.clip_gradients(model, max_norm=1.0), lower the peak learning rate, "
        "and roll back with trainopt.stability.TrainingRecovery",
        f"{GUIDE}#loss-explosion"),
    "gradient_explosion": (
        "outlier batches or an unstable layer produce gradients many times their usual size",
        "clip by global norm (trainopt.stability.clip_gradients) or adaptively "
        "(trainopt.stability.ZScoreClipper) and check the data of the flagged steps",
        f"{GUIDE}#gradient-explosion"),
    "diverging": (
        "the learning rate is above the stable range (often the end of a warm-up to a peak too high)",
        "lower the peak learning rate (find one with trainopt.schedules.LearningRateFinder) and warm up "
        "with trainopt.schedules.cosine_annealing_schedule(optimizer, total_steps, warmup_steps)",
        f"{GUIDE}#loss-diverging"),
    "oscillating": (
        "the learning rate is a little too high for the curvature, or batches are too small",
        "decay the learning rate (trainopt.schedules.cosine_annealing_schedule) or lower it; "
        "a larger batch lowers the noise",
        f"{GUIDE}#oscillating-loss"),
    "plateau": (
        "updates too small to change the loss: a tiny or fully decayed learning rate, dead units",
        "check the learning rate actually applied (trainopt.schedules.LRMonitor); raise it, or "
        "restart it with trainopt.schedules.CyclicalLearningRate",
        f"{GUIDE}#plateau"),
    "slow_convergence": (
        "the learning rate is too small, or decays too early",
        "run a range test (trainopt.schedules.LearningRateFinder) and take its suggestion; "
        "decay later (trainopt.schedules.wsd_schedule)",
        f"{GUIDE}#slow-convergence"),
    "out_of_memory": (
        "a leak (tensors kept with their autograd graph) if memory grows each step; otherwise "
        "activations of a batch too large",
        "keep only detached values (loss.item() every check_every steps, or .detach()), evaluate "
        "under torch.no_grad(); then see trainopt.perf.memory for checkpointing and smaller batches",
        f"{GUIDE}#out-of-memory"),
    "slow_training": (
        "something outside the model slowed each step: data loading, a host-device sync, logging",
        "profile a few steps (trainopt.perf.profiling) and compare the slow and fast steps",
        f"{GUIDE}#slow-training"),
    "comm_overhead": (
        "gradients are sent in many small messages, or communication does not overlap the backward pass",
        "all-reduce in large buckets and overlap with the backward pass (DDP's bucket_cap_mb; "
        "see trainopt.perf.distributed)",
        f"{GUIDE}#communication-overhead"),
}
