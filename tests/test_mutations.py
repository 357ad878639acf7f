"""The suite catches breaks: each deliberate break of ``src/`` fails at least one named test.

Each mutation below is applied to a scratch copy of ``src/``; the tests that should catch it run
against that copy (``PYTHONPATH`` puts it first, and every process the tests start inherits it)
and must fail. The text a mutation replaces must occur exactly once, so a mutation can't go stale
silently when the code changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from artifacts import append_line

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to src/trainopt
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids, relative to the repository root


MUTATIONS = [
    Mutation(
        "the clipping factor is not clamped to 1 (small gradients are scaled up)",
        "stability/clipping/norms.py",
        """    return torch.nn.utils.clip_grad_norm_(
        _params(model_or_params), max_norm, norm_type, error_if_nonfinite, foreach
    )""",
        """    params = [p for p in _params(model_or_params) if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type)
    for p in params:
        p.grad.mul_(max_norm / (norm + 1e-6))
    return norm""",
        ("tests/stability/test_clipping_by_hand.py",),
    ),
    Mutation(
        "the on-device clipping coefficient is not clamped to 1",
        "stability/clipping/norms.py",
        "coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)",
        "coef = max_norm / (total_norm + 1e-6)",
        ("tests/stability/test_clipping_by_hand.py", "tests/stability/test_clipping.py"),
    ),
    Mutation(
        "the median pruner sees only its own worker's trials",
        "hpo/study.py",
        "        return optuna.pruners.MedianPruner(\n"
        "            n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps\n"
        "        )",
        """        class OwnWorkerMedian(optuna.pruners.MedianPruner):
            def prune(self, study, trial):
                me, every = trial.user_attrs.get("worker"), study.get_trials
                study.get_trials = lambda *a, **k: [t for t in every(*a, **k)
                                                    if t.user_attrs.get("worker") == me]
                try:
                    return super().prune(study, trial)
                finally:
                    del study.get_trials

        return OwnWorkerMedian(n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps)""",
        (
            "tests/hpo/test_hpo_workers.py::test_two_workers_run_the_budget_and_prune_with_each_others_results[sqlite]",
        ),
    ),
    Mutation(
        "a skipped first step leaves its new state at zero",
        "stability/skipping/step.py",
        "            initial = overrides[key](value) if key in overrides else state.initial[key]",
        "            initial = torch.zeros_like(value)",
        (
            "tests/stability/test_skip.py::test_a_skipped_step_then_clean_steps_equals_the_clean_"
            "steps_of_plain_torch[ASGD() [foreach=False]-first step]",
        ),
    ),
    Mutation(
        "the speed-up is inverted (baseline over candidate)",
        "perf/bench/harness.py",
        '        ratio = b["tokens_per_s"] / a["tokens_per_s"]',
        '        ratio = a["tokens_per_s"] / b["tokens_per_s"]',
        ("tests/perf/bench/test_bench.py::test_speedup_is_candidate_over_baseline_throughput",),
    ),
    Mutation(
        "the stabilizer's step reads the skip flag on the host (a sync)",
        "stability/core.py",
        "        found_inf = skip.to(torch.float32)\n",
        "        found_inf = skip.to(torch.float32)\n        _ = bool(found_inf)\n",
        (
            "tests/stability/test_sync_free.py::test_fifty_steady_state_steps_of_each_configuration_"
            "make_no_host_sync[GPT, bf16 autocast, cosine LambdaLR]",
        ),
    ),
    Mutation(
        "a rollback does not reopen the schedule window (its first window runs at the uncut rate)",
        "stability/core.py",
        "        self.window.reopen()\n"
        "        self.window_start = self.steps\n        logger.warning(",
        "        self.window_start = self.steps\n        logger.warning(",
        (
            "tests/stability/test_rollback_path.py::test_after_a_rollback_each_step_runs_at_lr_factor_times_"
            "the_schedule_at_the_restored_position[stabilizer]",
        ),
    ),
    Mutation(
        "a window with flagged steps in a row becomes a rollback target",
        "stability/core.py",
        '        if report["is_stable"]:\n            return True\n        return (',
        "        return True or (",
        (
            "tests/stability/test_rollback_path.py::test_a_window_with_two_flagged_steps_in_a_row_is_no_"
            "rollback_target[stabilizer]",
        ),
    ),
    Mutation(
        "a resume does not restore the random generators (the masks drawn after a restart differ)",
        "stability/checkpointing/rank_state.py",
        '        set_rng_state(entry["rng"])\n',
        "        pass  # the generators are not restored\n",
        # the 10-s restart test first (-x stops at the first failure); the recipe's SIGKILL test,
        # 50 s, catches it too
        (
            "tests/stability/test_stabilizer.py"
            "::test_a_restart_from_the_stabilizers_own_checkpoint_is_bitwise_the_same_run",
            "tests/stability/test_recipe_restarts.py"
            "::test_a_run_killed_at_random_moments_ends_bitwise_equal_to_an_uninterrupted_run",
        ),
    ),
    Mutation(
        "the resumable loader draws its workers' seed from the global generator",
        "stability/checkpointing/loader.py",
        "        self.generator.manual_seed(_epoch_seed(self.seed, self.epoch) ^ 0x5EED)\n",
        "        self.generator = None  # DataLoader draws from the global generator\n",
        (
            "tests/stability/test_data_resume.py"
            "::test_a_resumed_run_with_dropout_equals_the_uninterrupted_run_bitwise[0-False]",
        ),
    ),
    Mutation(
        "the resumable loader's position counts the batches its workers fetched",
        "stability/checkpointing/loader.py",
        '"epoch": self.epoch, "position": self.consumed}',
        '"epoch": self.epoch, "position": self.batch_sampler.position}',
        (
            "tests/stability/test_data_resume.py"
            "::test_a_resumed_run_with_dropout_equals_the_uninterrupted_run_bitwise[2-False]",
        ),
    ),
    Mutation(
        "the checkpoint written before the first step holds the position after the first batch",
        "stability/checkpointing/rank_state.py",
        "        if initial is None or self.stabilizer.steps != 0:\n",
        "        if True:\n",
        (
            "tests/stability/test_recipe_restarts.py"
            "::test_a_resume_from_the_checkpoint_written_before_the_first_step_is_the_same_run",
        ),
    ),
    Mutation(
        "the resumable loader's workers draw from a seed per epoch and worker, not per batch",
        "stability/checkpointing/loader.py",
        '        if kwargs.get("num_workers", 0) > 0:\n',
        "        if False:\n",
        (
            "tests/stability/test_data_resume.py"
            "::test_random_draws_in_getitem_resume_bitwise_mid_epoch[2-False]",
        ),
    ),
    Mutation(
        "an averaged model counts a skipped update",
        "stability/skipping/averaging.py",
        "    count.copy_(torch.where(keep(count.device), count, count + 1))",
        "    count.add_(1)",
        (
            "tests/stability/test_averaging.py"
            "::test_an_applied_update_is_torchs_and_a_skipped_one_changes_nothing[running mean]",
        ),
    ),
]


@pytest.fixture(scope="module")
def pristine() -> Path:
    return ROOT / "src"


@pytest.mark.slow
@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_the_suite_catches_the_break(mutation: Mutation, pristine: Path, tmp_path: Path) -> None:
    target = pristine / "trainopt" / mutation.path
    text = target.read_text()
    assert text.count(mutation.old) == 1, (
        f"the mutation of {mutation.path} no longer matches the code"
    )
    scratch = tmp_path / "src"
    shutil.copytree(pristine, scratch, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (scratch / "trainopt" / mutation.path).write_text(text.replace(mutation.old, mutation.new))
    env = {**os.environ, "PYTHONPATH": str(scratch)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:randomly", *mutation.tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    # 1: tests ran and failed. 0 would mean the break went unnoticed; 2-5 a broken invocation.
    assert result.returncode == 1, (
        f"{mutation.name}: pytest exited {result.returncode}\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
    )
    assert " failed" in result.stdout.splitlines()[-1], result.stdout[-2000:]
    caught = [
        line.split(" - ")[0].removeprefix("FAILED ")
        for line in result.stdout.splitlines()
        if line.startswith("FAILED ")
    ]
    assert caught, result.stdout[-2000:]
    append_line("mutations.txt", f"{mutation.name}: caught by {caught[0]}")  # under a lock
