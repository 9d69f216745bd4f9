"""Fault harness: real gunicorn gevent servers and Celery workers, real faults, one table per scenario.

Run with ``.venv/bin/python -m bench.soak`` (``make soak``); ``--scenario`` picks scenarios (default:
all six), ``--runs`` changes the number of runs of every picked scenario, ``--quick`` runs small
numbers. Each table is printed as markdown as soon as its scenario ends; every figure, the settings
and the machine go to ``bench/results/soak-<date>.json`` (``soak-<date>-quick.json`` with
``--quick``). The exit status is 1 when an invariant was broken (listed under each table as
"Problems").
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from . import api_kill, celery_kill, gaps, slow_client, store_restart, storm
from .report import Table, machine, write_results
from .services import SHARED_POSTGRES, Services, services

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIOS = ("storm", "celery-kill", "api-kill", "store-restart", "slow-client", "gaps")
#: Another engineer's hostile-input fuzzer; run (as ``--scenario fuzz``) only where it exists.
FUZZ_MODULE = "bench.soak_fuzz"


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """Each scenario's options, from its defaults, ``--quick``, ``--runs``, ``--stores`` and ``--seed``."""
    quick = args.quick
    options: dict[str, Any] = {
        "storm": storm.StormOptions(runs=20 if quick else 500),
        "celery-kill": celery_kill.CeleryKillOptions(),
        "api-kill": api_kill.ApiKillOptions(runs=10 if quick else 60, wave=10 if quick else 20),
        "store-restart": store_restart.StoreRestartOptions(runs=4 if quick else 8),
        "slow-client": slow_client.SlowClientOptions(stall=10 if quick else 60, before=5 if quick else 20),
        "gaps": gaps.GapsOptions(runs=3 if quick else 6),
    }
    for name, value in options.items():
        changes: dict[str, Any] = {}
        fields = {field.name for field in dataclasses.fields(value)}
        if args.runs is not None and "runs" in fields:
            changes["runs"] = args.runs
        if args.stores and "stores" in fields:
            changes["stores"] = tuple(args.stores.split(","))
        if args.seed is not None and "seed" in fields:
            changes["seed"] = args.seed
        if name == "slow-client" and args.stall is not None:
            changes["stall"] = args.stall
        if name == "slow-client" and quick:
            changes["after"] = 5
        options[name] = dataclasses.replace(value, **changes)
    return options


def _runner(name: str, options: Any) -> Callable[[Services, pathlib.Path], Table]:
    scenarios: dict[str, Callable[[Services, pathlib.Path, Any], Table]] = {
        "storm": storm.run,
        "celery-kill": celery_kill.run,
        "api-kill": api_kill.run,
        "store-restart": store_restart.run,
        "slow-client": slow_client.run,
        "gaps": gaps.run,
    }
    return lambda found, directory: scenarios[name](found, directory, options)


def _fuzz() -> Table:
    """Run the fuzzer as its own process and keep the end of what it printed."""
    table = Table("fuzz", f"Hostile input ({FUZZ_MODULE})", ["exit status", "seconds"])
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", FUZZ_MODULE], cwd=ROOT, capture_output=True, text=True, check=False)
    table.seconds = time.monotonic() - began
    table.add({"exit status": result.returncode, "seconds": round(table.seconds)})
    table.notes.append(f"Its output (last lines):\n\n```\n{result.stdout[-3000:]}\n```")
    if result.returncode != 0:
        table.problems.append(f"{FUZZ_MODULE} exited with {result.returncode}: {result.stderr[-1000:]}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    choices = SCENARIOS + (("fuzz",) if importlib.util.find_spec(FUZZ_MODULE) else ())
    parser.add_argument(
        "--scenario", action="append", choices=choices, help=f"a scenario to run (repeatable; default: {SCENARIOS})"
    )
    parser.add_argument("--runs", type=int, help="runs per store or broker, for every picked scenario")
    parser.add_argument("--stores", help="comma-separated stream stores, for the scenarios that take them")
    parser.add_argument("--quick", action="store_true", help="small numbers (a smoke run of a few minutes)")
    parser.add_argument("--stall", type=float, help="seconds the slow client reads nothing (default 60)")
    parser.add_argument("--seed", type=int, help="seed of the clients' random drop points and server choices")
    parser.add_argument("--postgres-url", default=SHARED_POSTGRES, help="server for PostgreSQL stores' schemas")
    parser.add_argument("--work-dir", type=pathlib.Path, help="logs and data (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory even when nothing failed")
    args = parser.parse_args(argv)
    picked = args.scenario or list(SCENARIOS)
    options = _options(args)
    work = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["python -m bench.soak", *(argv if argv is not None else sys.argv[1:])]),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "options": {name: dataclasses.asdict(options[name]) for name in picked if name in options},
        "scenarios": {},
    }
    began = time.monotonic()
    tables: list[Table] = []
    with services(args.postgres_url) as found:
        for name in picked:
            print(f"## {name}: running…", file=sys.stderr, flush=True)
            table = _fuzz() if name == "fuzz" else _runner(name, options[name])(found, work / name)
            tables.append(table)
            results["scenarios"][name] = table.as_json()
            print(table.markdown(), flush=True)
    results["seconds"] = round(time.monotonic() - began, 1)
    path = write_results(results, "-quick" if args.quick else "")
    problems = [problem for table in tables for problem in table.problems]
    print(f"results written to {path.relative_to(ROOT)}; {results['seconds']:.0f} s in all")
    if problems:
        print(f"{len(problems)} problem(s); logs and data kept in {work}")
        return 1
    if not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs and data in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
