"""The one reader of results files (trainopt.perf.bench.results), the pages' renderer and chart
(trainopt_site.perf.bench.report and .plots), and every table the pages render: each shows only
numbers that its results file holds."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from trainopt.perf.bench.configs import BenchConfig
from trainopt.perf.bench.estimates import run as run_estimates
from trainopt.perf.bench.experiments import run as run_experiments
from trainopt.perf.bench.harness import run_matrix, speedup
from trainopt.perf.bench.results import SCHEMA, new_results, read_results
from trainopt.perf.bench.scaling import run as run_scaling
from trainopt.perf.bench.stability import run as run_stability
from trainopt.perf.compilation import measure_compile
from trainopt_site.perf.bench.plots import plot_results
from trainopt_site.perf.bench.report import NUMBER_FORMATS, PARTS, render

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "docs" / "_data"
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
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@pytest.fixture(scope="module")
def bench() -> dict[str, Any]:
    configs = [
        BenchConfig(batch_size=2, seq_len=16, label="plain"),
        BenchConfig(
            batch_size=2, seq_len=16, precision="bf16", optimizer="fused", label="bf16 fused"
        ),
        BenchConfig(batch_size=2, seq_len=16, precision="fp16", label="fp16"),
    ]
    results = run_matrix(
        configs,
        "cpu",
        progress=False,
        profile_steps=1,
        warmup_steps=1,
        max_warmup_steps=4,
        steps=2,
        windows=2,
    )
    results["recipe"] = speedup(results, "plain", "bf16 fused")
    return results


@pytest.fixture(scope="module")
def documents(bench: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "bench": bench,
        "stability": run_stability(
            size="tiny",
            device="cpu",
            batch_size=2,
            seq_len=16,
            steps_per_window=1,
            windows=2,
            warmup_steps=1,
            max_warmup_steps=3,
        ),
        "experiments": run_experiments(
            "tiny", "cpu", batch_size=2, seq_len=16, steps=2, warmup=1, max_warmup=4
        ),
        "scaling": run_scaling(
            2, "tiny", batch_size=2, seq_len=16, steps=1, windows=2, max_warmup_windows=2
        ),
        "compile": measure_compile(
            batch_size=2,
            seq_len=8,
            backend="eager",
            steps=1,
            windows=1,
            warmup_steps=1,
            max_warmup_steps=2,
        ),
        "estimate": run_estimates(
            ["mlp"], precisions=["bf16"], optimizers=["sgd"], checkpointing=[True]
        ),
    }


def allowed_numbers(results: Any) -> set[str]:
    """Every number token that formatting a value of a results file can print."""
    allowed: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            allowed.update(
                NUMBER.findall(value) + NUMBER.findall(value[:10])
            )  # a commit is shown by 10 characters
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            for fmt in NUMBER_FORMATS:
                allowed.update(NUMBER.findall(fmt(value)))
            allowed.update(
                NUMBER.findall(f"{value / 1e6:.1f}")
                + NUMBER.findall(f"{value / 1e9:.4f}")
                + NUMBER.findall(f"{value / 1e12:.1f}")
                + NUMBER.findall(f"{value / 1e3:.2f}")
            )

    walk(results)
    # the prose: the 10% warm-up rule, the checkpointing goal (30%, 20%), 6·N + 12·L·d·T, p10–p90
    return allowed | {"10", "30", "20", "6", "12", "90"}


def stray_numbers(text: str, results: Any) -> set[str]:
    return set(NUMBER.findall(text)) - allowed_numbers(results)


@pytest.mark.parametrize("kind", list(PARTS))
def test_every_part_shows_only_numbers_from_its_results(
    documents: dict[str, Any], kind: str
) -> None:
    text = render(documents[kind])
    assert not stray_numbers(text, documents[kind]), text


@pytest.mark.parametrize("kind", list(PARTS))
def test_the_number_check_catches_a_number_not_in_the_results(
    documents: dict[str, Any], kind: str
) -> None:
    text = render(documents[kind]) + "\nThe recipe is 123456.7 times faster."
    assert stray_numbers(text, documents[kind]) == {"123456.7"}


def test_every_table_is_labelled_with_hardware_date_and_commit(documents: dict[str, Any]) -> None:
    for results in documents.values():
        last = render(results).strip().splitlines()[-1]
        meta = results["meta"]
        assert (
            last.startswith("*CPU (")
            and meta["date"][:10] in last
            and meta["git_commit"][:10] in last
        )


def test_a_dirty_tree_is_said_under_the_table(bench: dict[str, Any]) -> None:
    dirty = copy.deepcopy(bench)
    dirty["meta"]["git_dirty"] = True
    assert "with uncommitted changes" in render(dirty) and "with uncommitted changes" not in render(
        {**dirty, "meta": {**dirty["meta"], "git_dirty": False}}
    )


def test_a_missing_file_is_one_line_naming_the_command(tmp_path: Path) -> None:
    text = render(tmp_path / "perf_h100.json")
    assert text.count("\n") == 1 and "|" not in text
    assert (
        "`python -m trainopt.perf.bench all --preset h100 --out-dir docs/_data` on an H100" in text
    )


def test_a_missing_scaling_file_names_the_scaling_command(tmp_path: Path) -> None:
    text = render(tmp_path / "bench_scaling_cpu.json")
    assert text.count("\n") == 1 and "`python -m trainopt.perf.bench scaling" in text


def test_the_reader_refuses_a_file_of_another_schema(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"meta": {}, "results": []}))
    with pytest.raises(ValueError, match=f"not a results file of schema {SCHEMA}"):
        read_results(old)
    assert read_results(new_results("bench", "cpu"))["kind"] == "bench"


def test_unknown_parts_are_refused(bench: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"parts of a bench file must be among \['results'"):
        render(bench, ["estimate"])


def test_an_error_message_cannot_break_the_table(bench: dict[str, Any]) -> None:
    results = copy.deepcopy(bench)
    results["results"][2]["error"] = "bad | pipe\nand a second line"
    row = next(
        line for line in render(results, ["results"]).splitlines() if line.startswith("| fp16 |")
    )
    assert row.count("|") == 6 and "bad / pipe and a second line" in row


def test_the_recipe_line_says_how_much_faster_from_the_stored_speedup(
    bench: dict[str, Any],
) -> None:
    results = copy.deepcopy(bench)
    results["recipe"]["speedup"] = 2.5
    assert render(results, ["recipe"]).startswith("**Speed-up 2.50×** (faster)")
    results["recipe"]["speedup"] = 0.4
    assert "slower: the recipe does not pay off here" in render(results, ["recipe"])


def test_the_mfu_goal_is_checked_on_a_gpu_run_only(bench: dict[str, Any]) -> None:
    assert render(bench, ["goal"]).startswith("MFU against a tensor-core peak is a GPU measure")
    gpu = copy.deepcopy(bench)
    gpu["meta"].update(device="cuda", device_name="NVIDIA H100 80GB HBM3")
    gpu["goal"]["size"] = "tiny"
    for record, value in zip(gpu["results"][:2], (0.3, 0.6)):
        record["mfu"] = value
    best = max(gpu["results"][:2], key=lambda r: r["tokens_per_s"])
    for goal, verdict in ((best["mfu"] + 0.05, "misses"), (best["mfu"] - 0.05, "meets")):
        gpu["goal"]["mfu"] = goal
        text = render(gpu, ["goal"])
        assert f"**{verdict}**" in text and best["name"] in text


def test_profile_shares_add_up_and_the_table_shows_the_fastest(bench: dict[str, Any]) -> None:
    profiled = [r for r in bench["results"] if r["status"] == "ok"]
    for record in profiled:
        categories = record["profile"]["categories"].values()
        assert sum(c["share"] for c in categories) == pytest.approx(1.0)
        assert sum(c["s_per_step"] for c in categories) == pytest.approx(
            record["profile"]["busy_s_per_step"]
        )
    fastest = max(profiled, key=lambda r: r["tokens_per_s"])
    assert render(bench, ["profile"]).startswith(f"Profile of {fastest['name']}")


def test_chart_has_one_bar_per_measured_configuration(
    bench: dict[str, Any], tmp_path: Path
) -> None:
    fig = plot_results(bench)
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 2
    assert (
        plot_results(tmp_path / "bench_h100.json").axes[0].texts[0].get_text()
        == "no results in bench_h100.json yet"
    )


# ---------------------------------------------------------------------------------------------
# The pages: every rendered table comes from a results file the project's command wrote
# ---------------------------------------------------------------------------------------------


def page_renders(page: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """``(function, data path, kwargs)`` of every ``trainopt-render`` block of a page that shows
    benchmark results."""
    found = re.findall(r"```\{trainopt-render\} (\S+)\n((?::\w+: .*\n)*)```", page.read_text())
    renders = []
    for dotted, options in found:
        opts = dict(re.findall(r":(\w+): (.*)", options))
        if dotted.startswith("trainopt_site.perf.bench."):
            renders.append((dotted, opts.get("data", ""), json.loads(opts.get("kwargs", "{}"))))
    return renders


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_table_on_the_page_shows_only_numbers_from_its_results_file(page: Path) -> None:
    import importlib

    renders = page_renders(page)
    assert renders, f"{page.name} renders no results"
    for dotted, data, kwargs in renders:
        module, name = dotted.rsplit(".", 1)
        function = getattr(importlib.import_module(module), name)
        if not data:
            continue  # a table of constants (the peak table)
        path = ROOT / "docs" / data
        text = function(path, **kwargs)
        results = json.loads(path.read_text()) if path.exists() else {}
        stray = (
            set(NUMBER.findall(text)) - allowed_numbers(results) - set(NUMBER.findall(path.name))
        )
        assert not stray, f"{dotted} on {data} shows numbers not in the file: {stray}"
        assert "Not yet measured" not in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_page_renders_a_measurement_of_this_machine(page: Path) -> None:
    files = {data for _, data, _ in page_renders(page) if data}
    assert any((ROOT / "docs" / f).exists() for f in files), (
        f"{page.name}: no results file that exists"
    )


def test_pages_type_no_result_table_by_hand() -> None:
    """The benchmarking page's tables of results are rendered from their files: a table typed on
    the page (the framework settings) holds no number outside its code."""
    rows = [line for line in PAGES[0].read_text().splitlines() if line.lstrip().startswith("|")]
    typed = [row for row in rows if NUMBER.search(re.sub(r"`[^`]*`", "", row))]
    assert typed == []


@pytest.mark.parametrize(
    "path",
    sorted(DATA.glob("bench_*.json")) + sorted(DATA.glob("perf_*.json")),
    ids=lambda p: p.name,
)
def test_committed_results_files_come_from_a_clean_tree(path: Path) -> None:
    results = read_results(path)
    meta = results["meta"]
    assert meta["git_dirty"] is False and len(meta["git_commit"]) == 40
    assert meta["command"].startswith("python -m trainopt.perf.bench ")
    assert (meta["device"] == "cuda") == path.stem.endswith(
        "h100"
    )  # GPU files come from a GPU, and only they


def _prose(page: str) -> str:
    return " ".join((ROOT / "docs" / "advanced" / "performance" / page).read_text().split())


def test_the_numbers_the_prose_quotes_are_those_of_the_results_files() -> None:
    # issue 33: a conclusion typed next to a table says what the table shows; a new recording
    # that changes these numbers fails here until the prose is updated with it
    perf = json.loads((DATA / "perf_cpu.json").read_text())
    bench = json.loads((DATA / "bench_cpu.json").read_text())
    compiled = json.loads((DATA / "compile_cpu.json").read_text())
    by_precision = {r["precision"]: r for r in perf["precision"] if r["supported"]}
    bf16, fp32 = by_precision["bf16"], by_precision["fp32"]
    memory_cut = 1 - bf16["peak_memory_bytes"] / fp32["peak_memory_bytes"]
    by_name = {r["name"]: r for r in bench["results"]}
    tiny_bf16 = by_name["tiny bf16 foreach 8x64"]["step_time_s"]["median"]
    tiny_fp32 = by_name["tiny plain PyTorch loop"]["step_time_s"]["median"]
    tiny_ckpt = by_name["tiny fp32 ckpt foreach 8x64"]["step_time_s"]["median"]
    policies = {r["policy"]: r for r in perf["checkpointing"]["rows"]}
    eager, default = compiled["rows"]

    def ms(value: float) -> str:
        return f"{value * 1e3:.0f}"

    def iqr(row: dict[str, Any]) -> str:
        return f"{row['step_time_ms']['q1']:.0f}–{row['step_time_ms']['q3']:.0f} ms"

    mixed = _prose("mixed-precision.md")
    assert f"ran {bf16['speedup_vs_fp32']:.2f}× faster on the small GPT" in mixed
    assert f"and {tiny_bf16 / tiny_fp32:.1f}× slower on the tiny one" in mixed
    assert f"peaks {memory_cut:.0%} lower" in mixed
    assert bf16["step_time_p10_ms"] > fp32["step_time_p90_ms"] or (
        bf16["step_time_p90_ms"] < fp32["step_time_p10_ms"]
    )  # "its p10–p90 well clear of fp32's"
    assert f"{tiny_bf16 / tiny_fp32:.1f}× slower than fp32" in _prose("benchmarking.md")

    memory = _prose("memory-optimization.md")
    assert f"every block added {policies['every block']['time_change']:.0%}" in memory
    assert f"`selective=True` {policies['selective']['time_change']:.0%}" in memory
    assert f"{tiny_ckpt / tiny_fp32 - 1:.0%} on the tiny GPT" in memory
    assert all(
        iqr(policies[p]) in memory for p in ("none", "every block", "every 2nd block", "selective")
    )
    assert f"each row is the median of {perf['meta']['settings']['steps']} steps" in memory
    every, second = policies["every block"], policies["every 2nd block"]
    assert second["step_time_ms"]["min"] < every["step_time_ms"]["min"]  # "is noise"

    compilation = _prose("compilation.md")
    assert f"The {default['speedup']:.2f}× is a ratio of medians" in compilation
    for row in (eager, default):
        assert f"{ms(row['step_s']['q1'])}–{ms(row['step_s']['q3'])} ms" in compilation
    assert f"({ms(eager['step_s']['min'])} and {ms(default['step_s']['min'])} ms)" in compilation


def test_the_performance_index_names_the_pages_whose_gpu_tables_wait_for_a_run() -> None:
    # issue 33: the index said every number was measured while the H100 tables were empty
    waiting = {
        page.name
        for page in PAGES
        for _, data, _ in page_renders(page)
        if data.endswith("_h100.json") and not (ROOT / "docs" / data).exists()
    }
    index = _prose("index.md")
    sentence = re.search(r"the H100 tables on (.*?) wait for a GPU run", index)
    named = set(re.findall(r"\(([^()]*?\.md)\)", sentence.group(1))) if sentence else set()
    assert {Path(n).name for n in named} == waiting
