"""The recorded run of the lossy gradient-compression hooks, and its table on the page.

:func:`measure_compression` runs :func:`trainopt.perf.distributed.compression.compression_check`
on two processes and returns the record ``docs/_data/distributed_compression.json`` holds
(``python -m trainopt_site.perf.distributed --out FILE``); :func:`compression_table` renders it.
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

import torch

from trainopt.models import GPT, gpt_config
from trainopt.perf.distributed.compression import MEASURED_HOOKS, compression_check
from trainopt.perf.distributed.processes import default_backend, launch


def measure_compression(
    nprocs: int = 2, iterations: int = 8, backend: str | None = None
) -> dict[str, Any]:
    """Run :func:`compression_check` on ``nprocs`` processes; return a JSON-ready record.

    Example:
        >>> from trainopt.perf.distributed.compression import MEASURED_HOOKS
        >>> from trainopt_site.perf.distributed.compression import measure_compression
        >>> record = measure_compression(nprocs=1, iterations=3)
        >>> record["world_size"], sorted(record["hooks"]) == sorted(MEASURED_HOOKS)
        (1, True)
    """
    per_rank = launch(compression_check, nprocs, MEASURED_HOOKS, iterations, backend=backend)
    model = GPT(gpt_config("tiny"))
    return {
        "what": "relative gradient error of lossy DDP communication hooks versus exact all-reduce",
        "model": f"GPT tiny ({model.num_parameters()} parameters), batch 8 x 16 tokens",
        "world_size": nprocs,
        "backend": backend or default_backend(nprocs),
        "iterations": iterations,
        "powersgd": {"start_powerSGD_iter": 2, "use_error_feedback": True, "warm_start": True},
        "hooks": per_rank[0],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def compression_table(path: str | Path) -> str:
    """A Markdown table of a :func:`measure_compression` JSON file.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.perf.distributed.compression import (
        ...     compression_table, measure_compression)
        >>> path = Path(tempfile.mkdtemp()) / "compression.json"
        >>> _ = path.write_text(json.dumps(measure_compression(nprocs=1, iterations=3)))
        >>> compression_table(path).splitlines()[0]
        '| hook | data sent | error per step (mean) | error per step (max) | error of the sum |'
    """
    data = json.loads(Path(path).read_text())
    lines = [
        "| hook | data sent | error per step (mean) | error per step (max) | error of the sum |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for spec, record in data["hooks"].items():
        name = spec.replace("powersgd:", "PowerSGD, rank ")
        if "unsupported" in record:
            lines.append(f"| {name} | — | not supported by {data['backend']} | — | — |")
            continue
        lines.append(
            f"| {name} | {record['sent_fraction']:.1%} | {record['mean']:.1e} | "
            f"{record['max']:.1e} | {record['cumulative']:.1e} |"
        )
    lines += [
        "",
        f"Measured with torch {data['torch']}, {data['backend']}, {data['world_size']} processes, "
        f"{data['model']}, on {data['date']}.",
    ]
    return "\n".join(lines)
