"""The log formats: JSON lines with the run's fields, or text with them; one setting switches."""

from __future__ import annotations

import io
import json
import logging
import threading

from api.extensions.ext_logging import JsonFormatter, TextFormatter
from api.libs.log_context import RunFieldsFilter, bound, fields_of

FIELDS = fields_of(app_id="a1", task_id="t1", workflow_run_id="r1", transport="durable_stream")


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(RunFieldsFilter())
    logger = logging.getLogger(f"test-log-format-{id(out)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, out


def test_json_lines_carry_the_bound_runs_fields_also_from_other_threads_that_name_it() -> None:
    logger, out = _logger(JsonFormatter())
    logger.info("before any run")
    with bound(FIELDS):
        logger.info("inside the run")
        # A timer or lease thread: no binding of its own, but the line names the run.
        thread = threading.Thread(target=lambda: logger.warning("run %s: lease renewal failed", "r1"))
        thread.start()
        thread.join()
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("run failed")
    logger.info("run %s after its binding", "r1")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["message"] for line in lines][:3] == [
        "before any run",
        "inside the run",
        "run r1: lease renewal failed",
    ]
    assert "workflow_run_id" not in lines[0] and "workflow_run_id" not in lines[4]
    for line in lines[1:4]:
        assert {name: line[name] for name in FIELDS} == FIELDS
    assert "ValueError: boom" in lines[3]["exc"]


def test_text_lines_carry_the_fields_too() -> None:
    logger, out = _logger(TextFormatter())
    with bound(FIELDS):
        logger.info("inside the run")
    assert (
        out.getvalue()
        .rstrip()
        .endswith("inside the run [app_id=a1 task_id=t1 workflow_run_id=r1 transport=durable_stream]")
    )
