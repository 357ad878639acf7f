"""trainopt.perf.compilation: graph breaks, compilations, regional compilation, the compile
benchmark."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import pytest
import torch

from trainopt.models import GPT, Block, gpt_config
from trainopt.perf.bench.cli import main
from trainopt.perf.compilation import (
    GraphCounter,
    compile_repeated_blocks,
    count_compilations,
    graph_breaks,
    measure_compile,
)
from trainopt_site.perf.bench.report import render


@pytest.fixture(autouse=True)
def quiet_dynamo():
    torch._logging.set_logs(dynamo=logging.ERROR)
    yield
    torch._dynamo.reset()
    torch._logging.set_logs()


def test_graph_breaks_counts_an_item_call_and_names_it() -> None:
    report = graph_breaks(lambda x: x.sin() * x.sum().item(), torch.ones(3))
    assert (report.graphs, report.graph_breaks) == (2, 1)
    assert any("item" in reason for reason in report.reasons)


def test_the_gpt_compiles_to_one_graph_without_breaks() -> None:
    model = GPT(gpt_config("tiny"))
    x = torch.zeros(2, 16, dtype=torch.long)
    report = graph_breaks(model, x, targets=x)
    assert (report.graphs, report.graph_breaks, report.reasons) == (1, 0, ())


def test_a_changed_dimension_recompiles_once_then_stays_dynamic() -> None:
    calls = [(torch.ones(n, 4),) for n in (2, 3, 4, 5)]
    assert count_compilations(torch.sin, calls) == 2
    assert count_compilations(torch.sin, calls, dynamic=False) == 4


def test_mark_dynamic_compiles_one_graph_for_every_batch_size() -> None:
    calls = [(torch.ones(n, 4),) for n in (2, 3, 4)]
    torch._dynamo.mark_dynamic(calls[0][0], 0)
    assert count_compilations(torch.sin, calls) == 1


def test_regional_compilation_traces_one_block_for_all_and_matches_eager() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = GPT(gpt_config("tiny", n_layer=3))
    regional, counter = GPT(gpt_config("tiny", n_layer=3)), GraphCounter()
    regional.load_state_dict(eager.state_dict())
    assert compile_repeated_blocks(regional, Block, backend=counter) == 3
    x = torch.randint(0, 512, (2, 16))
    torch.testing.assert_close(regional(x, targets=x), eager(x, targets=x))
    assert counter.graphs == 1


def test_measure_compile_rows_and_break_even() -> None:
    results = measure_compile(
        batch_size=2,
        seq_len=8,
        modes=("default",),
        backend="aot_eager",
        steps=1,
        windows=2,
        warmup_steps=1,
        max_warmup_steps=2,
    )
    eager, compiled = results["rows"]
    assert eager["mode"] == "eager" and eager["compile_s"] is None and eager["speedup"] == 1.0
    assert compiled["compile_s"] > 0 and compiled["graphs"] == 1
    saved = eager["step_s"]["median"] - compiled["step_s"]["median"]
    expected = compiled["compile_s"] / saved if saved > 0 else None
    assert compiled["break_even_steps"] == expected
    assert "| eager |" in render(results)


def test_the_compile_subcommand_writes_a_compile_results_file(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = main(
            [
                "compile",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--compile-backend",
                "eager",
                "--steps",
                "1",
                "--windows",
                "1",
                "--warmup",
                "1",
                "--max-warmup",
                "2",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
    saved = json.loads(out.read_text())
    assert code == 0 and saved["kind"] == "compile"
    lines = {line.split()[0]: line for line in printed.getvalue().splitlines()[2:]}  # the summary
    assert {row["mode"] for row in saved["rows"]} == set(lines)
    assert all(f"{row['speedup']:.2f}x" in lines[row["mode"]] for row in saved["rows"])


def test_a_missing_compile_file_names_its_command() -> None:
    assert "python -m trainopt.perf.bench compile --out docs/_data/compile_h100.json" in " ".join(
        render("compile_h100.json").split()
    )


def test_the_cuda_graph_defaults_the_page_states() -> None:
    # compilation.md, "CUDA graphs and what they cost": graph partitioning on, dynamic-shape
    # graphs recorded (not skipped), a warning past 8 recorded sizes
    from torch._inductor import config as inductor

    assert inductor.graph_partition is True
    assert inductor.triton.cudagraph_skip_dynamic_graphs is False
    assert inductor.triton.cudagraph_dynamic_shape_warn_limit == 8
