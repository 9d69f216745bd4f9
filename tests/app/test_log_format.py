"""The log formats: JSON lines with the run's fields, or text with them; one setting switches."""

from __future__ import annotations

import io
import json
import logging
import threading
import types

from api.extensions.ext_logging import JsonFormatter, TextFormatter, unraisable
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
    assert "workflow_run_id" not in lines[0]
    # After its binding too: a line naming a run whose fields this process built carries them.
    for line in lines[1:5]:
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


def test_a_lines_own_fields_are_fields_and_a_run_known_only_by_its_id_is_named() -> None:
    logger, out = _logger(JsonFormatter())
    # As Celery logs a task it received: its arguments (a form's answer) in a structured extra.
    secret = {"args": "('run', {'inputs': {'note': 'a secret answer'}})"}
    logger.info("served", extra={"method": "GET", "status": 200, "duration_ms": 1.5, "data": secret})
    logger.warning("run %s: could not queue its task now", "never-bound-run")
    served, refused = (json.loads(line) for line in out.getvalue().splitlines())
    assert (served["method"], served["status"], served["duration_ms"], served["message"]) == ("GET", 200, 1.5, "served")
    assert refused["workflow_run_id"] == "never-bound-run"
    assert not {"args", "msg", "levelno", "pathname", "thread", "data"} & (served.keys() | refused.keys())
    assert "secret answer" not in out.getvalue()


def test_an_unraisable_exception_is_one_json_record_and_nothing_while_finalizing() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("api.unraisable").addHandler(handler)
    try:
        try:
            raise TypeError("'NoneType' object is not callable")
        except TypeError as exc:
            info = types.SimpleNamespace(
                exc_type=TypeError, exc_value=exc, exc_traceback=exc.__traceback__, err_msg=None, object=print
            )
        unraisable(info)
        unraisable(info, lambda: True)  # the interpreter is finalizing: its modules are going away
    finally:
        logging.getLogger("api.unraisable").removeHandler(handler)
    assert len(records) == 1 and "not callable" in JsonFormatter().format(records[0])
