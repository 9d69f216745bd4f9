"""``--start`` of ``python -m bench.sse --scenario herd|deploy``: its values and how clients get a start."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from bench.sse import main
from bench.sse_starts import DIFY_MIX, START_KINDS, assign_starts, interleaved, parse_start, start_label


@pytest.mark.parametrize(
    ("text", "shares", "label"),
    [
        ("mix", {"tail": 0.5, "cursor": 0.25, "snapshot": 0.25}, "mix 50/25/25"),
        ("tail", {"tail": 1.0, "cursor": 0.0, "snapshot": 0.0}, "tail"),
        ("snapshot", {"tail": 0.0, "cursor": 0.0, "snapshot": 1.0}, "snapshot"),
        ("tail=50,cursor=25,snapshot=25", {"tail": 0.5, "cursor": 0.25, "snapshot": 0.25}, "mix 50/25/25"),
        ("tail=4, snapshot=1", {"tail": 0.8, "cursor": 0.0, "snapshot": 0.2}, "mix 80/0/20"),
        ("cursor=7", {"tail": 0.0, "cursor": 1.0, "snapshot": 0.0}, "cursor"),
    ],
)
def test_start_values(text: str, shares: dict[str, float], label: str) -> None:
    assert parse_start(text) == pytest.approx(shares)
    assert start_label(parse_start(text)) == label


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("head", "expected tail, cursor, snapshot, mix"),
        ("tail=half", "not a number"),
        ("tail=-1,cursor=2", ">= 0"),
        ("tail=nan", ">= 0"),
        ("tail=0,cursor=0", "add up to 0"),
        ("tail=1,tail=2", "given twice"),
        ("tail", ""),
    ],
)
def test_bad_start_values_are_refused_with_the_reason(text: str, message: str) -> None:
    if not message:
        parse_start(text)
        return
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_start(text)


def test_the_cli_refuses_a_bad_start_and_the_removed_cursor_share(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--scenario", "herd", "--start", "tail=-1"], ["--scenario", "herd", "--cursor-share", "0"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
    errors = capsys.readouterr().err
    assert "argument --start" in errors
    assert "unrecognized arguments: --cursor-share" in errors


def test_the_mix_alternates_kinds_in_arrival_order_and_holds_its_shares() -> None:
    sequence = interleaved(DIFY_MIX, 400)
    assert sequence[:4] == ["tail", "cursor", "snapshot", "tail"]
    # Any stretch of 4 holds the mix exactly; any prefix is within a client of it.
    for begin in range(len(sequence) - 4):
        assert Counter(sequence[begin : begin + 4]) == {"tail": 2, "cursor": 1, "snapshot": 1}
    for length in range(1, len(sequence)):
        counts = Counter(sequence[:length])
        assert all(abs(counts[kind] - DIFY_MIX[kind] * length) < 1 for kind in START_KINDS)


@pytest.mark.parametrize("runs", [1, 3, 4, 40])
def test_every_run_gets_every_kind_and_the_totals_match_the_mix(runs: int) -> None:
    clients = runs * 12
    starts = assign_starts(clients, runs, DIFY_MIX)
    assert starts == assign_starts(clients, runs, DIFY_MIX)  # deterministic
    for run in range(runs):
        assert set(starts[run::runs]) == set(START_KINDS), run  # client i follows run i % runs
    totals = Counter(starts)
    for kind in START_KINDS:
        assert abs(totals[kind] - DIFY_MIX[kind] * clients) <= runs / 4 + 1, totals
    # Each round of arrivals (one client per run) is a stretch of the interleaved sequence: it holds
    # the mix within a client or two, so no kind arrives in a block of its own.
    for begin in range(0, clients, runs):
        counts = Counter(starts[begin : begin + runs])
        assert all(abs(counts[kind] - DIFY_MIX[kind] * runs) < 2 for kind in START_KINDS), (begin, counts)


def test_a_single_kind_and_no_clients() -> None:
    assert assign_starts(10, 4, parse_start("tail")) == ["tail"] * 10
    assert assign_starts(0, 4, DIFY_MIX) == []
