"""Proof of crash safety: a writer saving checkpoints in a loop is SIGKILLed at random moments;
after every kill, ``load_latest`` succeeds at once (no corrupt file is ever the newest) and
returns a complete, self-consistent checkpoint.

One helper process imports torch once and forks a fresh writer for each round (an import per
kill would cost seconds); the test process does the checking.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from trainopt.stability.checkpointing.checkpoint import CheckpointManager

ROUNDS = 20

HELPER = textwrap.dedent(
    """
    import os, random, signal, sys, time
    import torch
    from trainopt.stability.checkpointing.checkpoint import CheckpointManager

    save_dir, rounds = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    rng = random.Random(0)

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(4)])
        opt = torch.optim.AdamW(model.parameters())
        model(torch.ones(1, 384)).sum().backward()
        opt.step()
        return model, opt

    def save(manager, model, opt, step):
        # every tensor of a checkpoint carries its step: a mix of two saves is detectable
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
            for state in opt.state.values():
                state["exp_avg"].fill_(step)
                state["exp_avg_sq"].fill_(step)
        manager.save_checkpoint(model, opt, step, 1.0 / (step + 1))

    model, opt = build()
    save(CheckpointManager(save_dir, keep_last=2), model, opt, 0)
    print("ready", flush=True)
    for r in range(rounds):
        sys.stdin.readline()
        pid = os.fork()
        if pid == 0:
            manager = CheckpointManager(save_dir, keep_last=2)
            step = (r + 1) * 100000
            while True:
                save(manager, model, opt, step)
                step += 1
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("killed", r, flush=True)
    """
)


@pytest.mark.skipif(
    not hasattr(os, "fork"), reason="needs os.fork (POSIX) for the writer processes"
)
def test_load_latest_survives_sigkill_at_random_moments(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(tmp_path), str(ROUNDS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert helper.stdout.readline().strip() == "ready"
        torch.manual_seed(1)
        model = torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(4)])
        opt = torch.optim.AdamW(model.parameters())
        seen_steps = []
        for r in range(ROUNDS):
            helper.stdin.write("go\n")
            helper.stdin.flush()
            assert helper.stdout.readline().split() == ["killed", str(r)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                manager = CheckpointManager(tmp_path, keep_last=2)
                restored = manager.load_latest(model, opt)
            assert restored is not None
            assert not caught, [str(w.message) for w in caught]  # the newest file was never torn
            step, loss = restored
            assert loss == 1.0 / (step + 1)
            for p in model.parameters():
                assert torch.all(p == step)
            for state in opt.state.values():
                assert torch.all(state["exp_avg"] == step) and torch.all(
                    state["exp_avg_sq"] == step
                )
            seen_steps.append(step)
            assert not list(tmp_path.glob(".*.tmp"))  # the killed writer's temporaries are cleaned
        assert helper.wait(timeout=30) == 0
    finally:
        if helper.poll() is None:
            helper.kill()
    # the kills landed while saves were under way: most rounds got further than their start
    assert sum(step % 100000 > 0 for step in seen_steps) >= ROUNDS // 2, seen_steps
