"""Watching a study (issue 22, requirement 12): optuna-dashboard on a study the command line made,
the parallel-coordinate and contour plots, and importances by the evaluator the page names."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import optuna
import pytest
import yaml

from trainopt.config.cli import run_command
from trainopt.hpo.cli import main
from trainopt.hpo.plots import (
    importance_evaluator,
    plot_contour,
    plot_importances,
    plot_parallel,
    save_plots,
)

PAGE = (
    Path(__file__).resolve().parents[2]
    / "docs"
    / "guides"
    / "training-optimization"
    / "hyperparameter-optimization.md"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _dashboard_command() -> list[str]:
    """The page's optuna-dashboard command."""
    blocks = re.findall(r"^```console\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    commands = [
        line[2:]
        for block in blocks
        for line in block.splitlines()
        if line.startswith("$ optuna-dashboard")
    ]
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def test_optuna_dashboard_sees_the_trials_of_a_study_the_command_line_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = {
        "study": {"name": "digits", "sampler": "random", "pruner": None},
        "training": {"steps": 10, "report_every": 5},
        "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
    }
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(config))
    assert run_command(main, ["digits.yaml", "--n-trials", "3", "--no-plots", "--no-progress"]) == 0

    command = _dashboard_command()
    assert (
        command[1] == "sqlite:///digits.db" and command[command.index("--host") + 1] == "127.0.0.1"
    )
    port = _free_port()
    command[command.index("--port") + 1] = str(port)
    command[0] = str(Path(sys.executable).parent / "optuna-dashboard")
    server = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        end = time.monotonic() + 90
        while True:
            try:
                studies = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < end, "optuna-dashboard did not answer within 90 s"
                time.sleep(0.3)
        assert [(s["study_name"], s["directions"]) for s in studies] == [("digits", ["minimize"])]
        detail = _get(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}")
        assert [(t["number"], t["state"]) for t in detail["trials"]] == [
            (0, "Complete"),
            (1, "Complete"),
            (2, "Complete"),
        ]
        assert len(detail["best_trials"]) == 1 and detail["trials"][0]["params"][0]["name"] == "lr"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


@pytest.fixture(scope="module")
def quadratic() -> optuna.Study:
    """x matters, y barely, z not at all."""
    study = optuna.create_study(study_name="q", sampler=optuna.samplers.RandomSampler(seed=0))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(
        lambda t: (
            4 * t.suggest_float("x", -1, 1) ** 2
            + 0.05 * t.suggest_float("y", -1, 1)
            + 0 * t.suggest_float("z", -1, 1)
        ),
        n_trials=40,
    )
    return study


def test_importances_are_ped_anova_on_every_optuna_in_the_range(quadratic: optuna.Study) -> None:
    """Optuna 5's default evaluator, passed explicitly (Optuna 4's default was fANOVA)."""
    assert type(importance_evaluator()) is optuna.importance.PedAnovaImportanceEvaluator
    expected = optuna.importance.get_param_importances(quadratic, evaluator=importance_evaluator())
    ax = plot_importances(quadratic).axes[0]
    shown = {
        label.get_text(): bar.get_width() for label, bar in zip(ax.get_yticklabels(), ax.patches)
    }
    plt.close("all")
    assert shown == pytest.approx(expected, abs=0.01) and max(shown, key=shown.get) == "x"


def test_parallel_and_contour_plots_draw_without_warnings(
    quadratic: optuna.Study, tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel = plot_parallel(quadratic)
        contour = plot_contour(quadratic)  # the two parameters PED-ANOVA ranks highest
    assert parallel.axes[0].get_title() == "Parallel Coordinate Plot"
    top_two = list(
        optuna.importance.get_param_importances(quadratic, evaluator=importance_evaluator())
    )[:2]
    assert [
        contour.axes[0].get_xlabel(),
        contour.axes[0].get_ylabel(),
    ] == top_two and "x" in top_two
    plt.close("all")
    names = [p.name for p in save_plots(quadratic, tmp_path)]
    assert names == [
        "q-history.png",
        "q-intermediate.png",
        "q-importances.png",
        "q-parallel.png",
        "q-contour.png",
    ]
