"""How many load processes hold a herd's sockets under the open-files limit every child inherits."""

from __future__ import annotations

import pytest

from bench.sse_stack import LOAD_PROCESS_SPARE_FILES, load_processes_for


def test_the_requested_processes_when_each_has_room_for_its_share() -> None:
    # The overload, 20,000 clients, on this machine's limit of 20,000: 5,000 sockets each.
    assert load_processes_for(20_000, 4, 20_000) == 4


def test_more_processes_when_one_would_run_out_of_descriptors() -> None:
    assert load_processes_for(20_000, 1, 20_000) == 2
    room = 4096 - LOAD_PROCESS_SPARE_FILES
    assert load_processes_for(room * 5 + 1, 2, 4096) == 6


def test_a_limit_with_no_room_for_a_client_is_an_error() -> None:
    with pytest.raises(ValueError, match="leaves no room"):
        load_processes_for(10, 1, LOAD_PROCESS_SPARE_FILES)
