"""The engine's output on the supervisor's stderr: one log record per read (P2b: a record per line
was the supervisor's largest CPU cost while serving on a GPU), every line still with the log's prefix."""

from __future__ import annotations

import io
import logging

from supervisor.run import logs


def test_every_engine_line_of_a_read_gets_the_prefix_and_other_records_are_untouched():
    kiln = logging.getLogger("kiln")
    saved = (kiln.handlers[:], kiln.propagate, kiln.level)
    try:
        check()
    finally:
        kiln.handlers[:], kiln.propagate, kiln.level = saved


def check() -> None:
    logs.setup_logging()
    handler = logging.getLogger("kiln").handlers[0]
    out = io.StringIO()
    handler.setStream(out)
    logs.engine_lines(["slot launch_slot_: id 0 | task 7", "", "srv log_server_r: request: POST /v1 200"])
    logging.getLogger("kiln").info("a supervisor line\nwith a second line")
    lines = out.getvalue().splitlines()
    engine, own = lines[:3], lines[3:]
    prefix = engine[0][: engine[0].index("kiln.engine INFO ")]
    assert engine == [prefix + "kiln.engine INFO slot launch_slot_: id 0 | task 7", prefix + "kiln.engine INFO ",
                      prefix + "kiln.engine INFO srv log_server_r: request: POST /v1 200"]
    assert own[0].endswith("kiln INFO a supervisor line") and own[1] == "with a second line"
