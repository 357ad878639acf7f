"""python -m trainopt_site.perf.distributed: run every check, or measure the lossy hooks (JSON)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from trainopt.config.cli import ArgumentParser, UsageError, output_file, positive_int
from trainopt.perf.distributed.agreement import (
    broadcast_from_rank0,
    is_main_process,
)
from trainopt.perf.distributed.checks import (
    accumulation_check,
    ddp_check,
    fsdp_check,
    rank_consistent_skip_check,
    summed_loss_check,
    token_loss_check,
)
from trainopt.perf.distributed.compression import compression_check
from trainopt.perf.distributed.fsdp import fsdp2_available
from trainopt.perf.distributed.processes import init_from_env, launch
from trainopt_site.perf.distributed.compression import measure_compression


def all_checks(sharded: bool | None = None) -> dict[str, Any]:
    """Every check above in one process group (start-up of a process costs seconds).

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt_site.perf.distributed.cli import all_checks
        >>> with single_process_group():
        ...     results = all_checks(sharded=False)
        >>> sorted(results)[:3], results["ddp"]["max_param_diff"] <= 1e-5
        (['accumulation', 'broadcast', 'compression'], True)
    """
    sharded = fsdp2_available() if sharded is None else sharded
    results: dict[str, Any] = {
        "ddp": ddp_check(),
        "ddp_small_buckets": ddp_check(bucket_cap_mb=0.01),
        "ddp_static_graph_no_view": ddp_check(gradient_as_bucket_view=False, static_graph=True),
        "accumulation": accumulation_check(),
        "summed_loss": summed_loss_check(),
        "token_loss": token_loss_check(),
        "compression": compression_check(),
        "skip": rank_consistent_skip_check(),
        "broadcast": broadcast_from_rank0(f"checkpoint chosen by rank {dist.get_rank()}"),
        "is_main_process": is_main_process(),
    }
    if sharded:
        results["fsdp"] = fsdp_check()
        results["fsdp_accumulation"] = accumulation_check(sharded=True)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    r"""Command line: ``--out FILE`` measures the lossy hooks, ``--equivalence`` runs the checks.

    Example:
        >>> from trainopt.config.cli import run_command
        >>> from trainopt_site.perf.distributed.cli import main
        >>> import contextlib, io
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     status = run_command(main, [])  # neither --out nor --equivalence
        >>> status, err.getvalue()
        (2, 'error: --out/--equivalence: give --out FILE, --equivalence, or both\n')
    """
    parser = ArgumentParser(
        prog="python -m trainopt_site.perf.distributed", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out", type=output_file, help="measure the lossy hooks and write this JSON file"
    )
    parser.add_argument(
        "--equivalence",
        action="store_true",
        help="run every equivalence check and print the results (works under torchrun)",
    )
    parser.add_argument(
        "--nprocs", type=positive_int, default=2, help="processes of the gloo group (default 2)"
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        default=8,
        help="training steps of each measured hook (default 8)",
    )
    args = parser.parse_args(argv)
    if args.out is None and not args.equivalence:
        raise UsageError("--out/--equivalence", "give --out FILE, --equivalence, or both")
    if args.equivalence:
        if "RANK" in os.environ:  # started by torchrun: this process is one rank
            init_from_env()
            results = all_checks()
            dist.destroy_process_group()
        else:
            results = launch(all_checks, args.nprocs)[0]
        if int(os.environ.get("RANK", "0")) == 0:
            for name, record in results.items():
                if isinstance(record, dict) and "max_param_diff" in record:  # not is_main_process
                    print(f"{name}: max parameter difference {record['max_param_diff']:.1e}")
    if args.out is not None:
        record = measure_compression(args.nprocs, args.iterations)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
