"""The one command line of the benchmarks:
``python -m trainopt.perf.bench {matrix,recipe,stability,experiments,all}``."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainopt.config.cli import run_command
from trainopt.perf.bench import experiments, stability
from trainopt.perf.bench.cli import build_parser, main
from trainopt.perf.bench.harness import speedup

ROOT = Path(__file__).resolve().parents[3]
PAGES = [
    ROOT / "docs" / "advanced" / "performance" / f"{name}.md"
    for name in (
        "benchmarking",
        "memory-optimization",
        "mixed-precision",
        "profiling",
        "monitoring",
        "compilation",
    )
]
PAGES.append(ROOT / "docs" / "guides" / "training-optimization" / "training-stability.md")
QUICK = ["--warmup", "1", "--max-warmup", "2", "--steps", "1", "--windows", "1", "--no-progress"]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "trainopt.perf.bench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def one_line_error(argv: list[str]) -> str:
    """Run ``main(argv)`` as the command does; require status 2 and one line on stderr; return
    it."""
    err = io.StringIO()
    assert run_command(main, argv, stderr=err) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


BAD_ARGUMENTS = [
    # (argv, the argument the message names, what it says)
    (["matrix", "--out", "m.json", "--steps"], "--steps", "expected one argument"),
    (["matrix", "--out", "m.json", "--precision", "fp8"], "--precision", "invalid choice: 'fp8'"),
    (["matrix", "--out", "m.json", "--windows", "0"], "--windows", "must be an int >= 1"),
    (["matrix", "--out", "m.json", "--seq-len", "65"], "--seq-len", "must be an int in [0, 64]"),
    (["matrix", "--precision", "fp32"], "--out", "required"),
    (["recipe", "--out", "r.json", "--batch-size", "0"], "--batch-size", "must be an int >= 1"),
    (["scaling", "--out", "s.json", "--processes", "1"], "--processes", "must be an int >= 2"),
    (["scaling", "--out", "s.json", "--windows", "x"], "--windows", "must be an int >= 0"),
    (["scaling", "--processes", "2"], "--out", "required"),
    (["scaling", "--out", "s.json", "--seq-len", "65"], "--seq-len", "must be an int in [0, 64]"),
    (["compare", "no-such-a.json", "no-such-b.json"], "no-such-a.json", "no such results file"),
    (
        ["compare", "a.json", "b.json", "--confidence", "95"],
        "--confidence",
        "must be a number in (0, 1)",
    ),
    (["compare", "a.json"], "candidate", "required"),
    (["recipe", "--out", "r.json", "--compile", "none"], "--compile", "invalid choice: 'none'"),
    (
        ["recipe", "--out", "r.json", "--peak-tflops", "0"],
        "--peak-tflops",
        "must be a positive TFLOP/s",
    ),
    (["recipe", "--out", "r.json", "--warmup", "-1"], "--warmup", "must be an int >= 0"),
    (["stability", "--out", "s.json", "--dtype", "fp16"], "--dtype", "invalid choice: 'fp16'"),
    (
        ["stability", "--out", "s.json", "--check-every", "0"],
        "--check-every",
        "must be an int >= 1",
    ),
    (["stability", "--out", "s.json", "--windows"], "--windows", "expected one argument"),
    (
        ["stability", "--out", "s.json", "--size", "tiny", "--seq-len", "100"],
        "--seq-len",
        "must be an int in [0, 64]",
    ),
    (["experiments", "--out", "p.json", "--size", "1b"], "--size", "invalid choice: '1b'"),
    (["experiments", "--out", "p.json", "--steps", "0"], "--steps", "must be an int >= 1"),
    (
        [
            "experiments",
            "--out",
            "p.json",
            "--size",
            "tiny",
            "--device",
            "cpu",
            "--snapshot",
            "s.pickle",
        ],
        "--snapshot",
        "records CUDA allocations",
    ),
    (["all", "--out-dir", "d"], "--preset", "required"),
    (["all", "--preset", "a100", "--out-dir", "d"], "--preset", "invalid choice: 'a100'"),
    (["all", "--preset", "cpu"], "--out-dir", "required"),
    (
        ["all", "--preset", "cpu", "--out-dir", "d", "--time-budget", "0"],
        "--time-budget",
        "must be a number > 0",
    ),
    (
        ["all", "--preset", "cpu", "--out-dir", "d", "--max-warmup", "0"],
        "--max-warmup",
        "must be an int >= 1",
    ),
    (["bench"], "command", "invalid choice: 'bench'"),
]


@pytest.mark.parametrize(
    "argv, field, message", BAD_ARGUMENTS, ids=[" ".join(a[0]) for a in BAD_ARGUMENTS]
)
def test_a_mistake_is_one_line_naming_the_argument(
    argv: list[str], field: str, message: str
) -> None:
    line = one_line_error(argv)
    assert line.startswith(f"error: {field}: ") and message in line, line


def test_a_mistake_prints_no_traceback_from_the_real_command(tmp_path: Path) -> None:
    result = run_cli(["matrix", "--precision", "fp8", "--out", "m.json"], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert (
        result.stderr.startswith("error: --precision: invalid choice: 'fp8'")
        and "Traceback" not in result.stderr
    )


def test_an_unwritable_results_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "a folder"
    folder.mkdir()
    line = one_line_error(
        [
            "stability",
            "--out",
            str(folder),
            "--size",
            "tiny",
            "--device",
            "cpu",
            "--batch-size",
            "1",
            "--seq-len",
            "8",
            *QUICK,
        ]
    )
    assert "a folder" in line


def test_the_old_module_entry_points_are_gone() -> None:
    for module in (stability, experiments):
        assert not hasattr(module, "main") and not hasattr(module, "build_parser")


def test_recipe_compares_the_two_loops_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recipe.json"
    assert (
        main(
            [
                "recipe",
                "--size",
                "tiny",
                "--batch-size",
                "2",
                "--seq-len",
                "16",
                "--compile-backend",
                "eager",
                "--out",
                str(out),
                *QUICK,
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    plain, recipe = saved["results"]
    assert [plain["status"], recipe["status"]] == ["ok", "ok"]
    assert saved["recipe"] == speedup(saved, "tiny plain PyTorch loop", "tiny trainopt recipe")
    assert (
        recipe["peak_memory_bytes"] is None and plain["peak_memory_bytes"] > 0
    )  # compiled: not counted on a CPU
    assert saved["meta"]["command"].startswith("python -m trainopt.perf.bench recipe --size tiny")
    printed = capsys.readouterr().out
    ratio = f"{saved['recipe']['speedup']:.2f}x"
    assert f"speed-up of tiny trainopt recipe over tiny plain PyTorch loop: {ratio}" in printed
    assert "|" not in printed and "**" not in printed  # a terminal summary, not the pages' MyST


def test_stability_writes_its_results_and_prints_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    assert (
        main(
            [
                "stability",
                "--out",
                str(out),
                "--size",
                "tiny",
                "--device",
                "cpu",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--note",
                "a test",
                "--forms",
                "SGD default",
                "AdamW fused",
                "--sync-steps",
                "2",
                "--threads",
                "1",
                *QUICK,
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    assert saved["kind"] == "stability" and saved["meta"]["note"] == "a test"
    assert saved["sync_check"]["passed"]
    assert [f["form"] for f in saved["forms"]] == ["SGD default", "AdamW fused"]
    assert saved["config"]["threads"] == 1 and saved["sync_check"]["steps"] == 2
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in printed[2:4]] == [["SGD", "default"], ["AdamW", "fused"]]
    assert not any("|" in line for line in printed)  # a terminal summary, not the pages' MyST


def console_commands() -> list[tuple[str, list[str]]]:
    """The ``$ python -m trainopt.perf.bench ...`` commands of the pages' console blocks."""
    commands = []
    for page in PAGES:
        # A command wrapped with a trailing backslash is one command.
        for line in page.read_text().replace("\\\n", " ").splitlines():
            words = shlex.split(line[2:]) if line.startswith("$ ") else []
            while words and "=" in words[0]:
                words.pop(0)  # an environment variable before the command
            if words[:3] == ["python", "-m", "trainopt.perf.bench"]:
                commands.append((page.stem, words))
    return commands


def test_the_pages_show_every_subcommand() -> None:
    assert {words[3] for _, words in console_commands()} == {
        "matrix",
        "recipe",
        "stability",
        "experiments",
        "all",
        "compare",
        "scaling",
        "compile",
        "estimate",
    }
    # and that is every subcommand the parser has
    assert {words[3] for _, words in console_commands()} == set(
        build_parser()._subparsers._group_actions[0].choices
    )
    text = "\n".join(page.read_text() for page in PAGES)
    for gone in (
        "trainopt.perf.bench.stability --out",
        "trainopt.perf.bench.experiments --out",
        "trainopt.bench ",
    ):
        assert gone not in text


@pytest.mark.parametrize(
    "page, words", console_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v[3:5])
)
def test_every_command_on_the_pages_parses(page: str, words: list[str]) -> None:
    args = build_parser().parse_args(words[3:])
    assert args.command == words[3]


def test_the_page_matrix_command_runs(tmp_path: Path) -> None:
    words = next(w for _, w in console_commands() if w[3] == "matrix")
    result = run_cli(words[3:] + ["--compile-backend", "eager", "--max-warmup", "6"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / words[words.index("--out") + 1]).read_text())
    statuses = {r["name"]: r["status"] for r in saved["results"]}
    assert (
        statuses["tiny fp32 foreach 8x64"] == "ok"
        and statuses["tiny fp16 foreach 8x64"] == "unsupported"
    )
    assert any(line.startswith("  tiny fp32 foreach 8x64  ") for line in result.stdout.splitlines())


def test_the_page_gpu_command_runs_at_tiny_size_on_a_cpu(tmp_path: Path) -> None:
    words = next(w for _, w in console_commands() if w[3] == "all" and "h100" in w)
    words[words.index("--out-dir") + 1] = str(tmp_path)
    result = run_cli(
        words[3:] + ["--size", "tiny", "--batch-size", "2", "--compile-backend", "eager", *QUICK],
        ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    bench = json.loads((tmp_path / "bench_h100.json").read_text())
    assert bench["meta"]["command"].startswith("python -m trainopt.perf.bench all --preset h100")
    assert {r["config"]["size"] for r in bench["results"]} == {"tiny"} and bench["recipe"][
        "speedup"
    ] is not None
    assert all("profile" in r for r in bench["results"] if r["status"] == "ok")
    assert json.loads((tmp_path / "bench_stability_h100.json").read_text())["sync_check"]["passed"]
    assert json.loads((tmp_path / "perf_h100.json").read_text())["model"]["size"] == "tiny"
