"""A boot config that does not validate leaves PID 1 up in FAILED, explaining on /status (issue 24,
item 3). Was: `python -m supervisor run` exited at once (2, or a traceback for a config that is not
UTF-8), with no /status; on RunPod the container restarted into the same failure, billing.

Real `python -m supervisor run` processes; no engine is ever started (the config is the failure).
Self-termination through the RunPod stand-in: tests/integration/test_runpod_self.py."""

from __future__ import annotations

import http.client
from pathlib import Path

from kiln_dev.supervised import Supervised, config, free_port, http as get, wait_for


def deploy(tmp_path: Path, extra: str = "") -> str:
    """A config that validates (its binary and model are never looked at: nothing launches)."""
    return config(binary="/opt/kiln/engine/bin/llama-server", model="/models/never-read.gguf", port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state", extra=extra,
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n')


def head(url: str) -> int:
    host, _, rest = url.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=5)
    try:
        conn.request("HEAD", "/" + rest)
        return conn.getresponse().status
    finally:
        conn.close()


def failed(sup: Supervised) -> dict:
    """The FAILED page, once it serves; the probes answer as for any FAILED supervisor."""
    st = sup.wait_state("FAILED", timeout=30)
    assert st["ready"] is False and st["engine"] is None and st["launches"] == 0
    assert get(sup.url("/live"))[0] == 200 and head(sup.url("/live")) == 200
    code, body = get(sup.url("/ready"))
    assert code == 503 and body == b"not ready: state=FAILED last_failure=config_rejected\n"
    assert head(sup.url("/ready")) == 503
    assert st["last_failure"]["class"] == "config_rejected"
    return st


def test_one_typo_in_the_pods_environment_leaves_pid_1_up_in_failed_naming_field_value_origin_and_fix(tmp_path):
    with Supervised(tmp_path, deploy(tmp_path), env={"KILN_SERVER_PORT": "abc"}) as sup:
        st = failed(sup)
        (p,) = st["last_failure"]["problems"]
        assert {k: p[k] for k in ("field", "value", "from", "problem")} == {
            "field": "server.port", "value": "abc", "from": "env KILN_SERVER_PORT", "problem": "must be an integer"}
        assert p["fix"].startswith("correct KILN_SERVER_PORT in the pod's environment")
        page = get(sup.url("/"))[1].decode()
        assert "server.port = &#x27;abc&#x27; (from env KILN_SERVER_PORT)" in page     # the HTML page says it too
        assert sup.proc.poll() is None, "PID 1 stays up"
        assert sup.stop() == 3
    log = sup.log()
    assert "server.port (from env KILN_SERVER_PORT): must be an integer (got 'abc')" in log
    assert "Traceback" not in log


def test_a_config_that_is_not_utf8_is_explained_on_its_own_status_port_with_the_bad_bytes_place(tmp_path):
    # A Latin-1 é in a comment: the [status] table still reads, so the page is where the file says.
    text = deploy(tmp_path).encode()
    text = text.replace(b'engine = "llamacpp"\n', b'engine = "llamacpp"\n# caf\xe9 au lait\n', 1)
    line = text[:text.index(b"\xe9")].count(b"\n") + 1
    with Supervised(tmp_path, text) as sup:
        st = failed(sup)
        (p,) = st["last_failure"]["problems"]
        assert p["field"] == "(file)" and p["from"] == str(sup.cfg_path) and p["value"] == str(sup.cfg_path)
        assert p["problem"] == f"is not UTF-8 text: byte 0xe9 at line {line}, column 6"
        assert "save the file as UTF-8" in p["allowed"]
        assert sup.stop() == 3
    assert "Traceback" not in sup.log()


def test_a_config_that_is_not_toml_is_explained_on_the_status_port_of_the_environment(tmp_path):
    port = free_port()
    text = deploy(tmp_path).replace("[ladder]\n", "[ladder\n", 1)
    with Supervised(tmp_path, text, env={"KILN_STATUS_PORT": str(port)}, status_port=port) as sup:
        st = failed(sup)
        (p,) = st["last_failure"]["problems"]
        assert p["field"] == "(toml)" and p["problem"].startswith("is not valid TOML: ") and "line" in p["problem"]
        assert p["from"] == str(sup.cfg_path) and "TOML syntax" in p["fix"]
        assert sup.stop(2) == 3                       # INT as TERM
    assert "Traceback" not in sup.log()


def test_a_boot_only_key_that_is_not_a_table_is_a_problem_not_a_crash_and_the_env_port_still_serves(tmp_path):
    # `status = 3` with KILN_STATUS_PORT set raised TypeError in config._apply_env.
    port = free_port()
    text = deploy(tmp_path).split("[status]")[0].replace('engine = "llamacpp"\n', 'engine = "llamacpp"\nstatus = 3\n')
    with Supervised(tmp_path, text, env={"KILN_STATUS_PORT": str(port)}, status_port=port) as sup:
        st = failed(sup)
        got = {(p["field"], p["from"]): p for p in st["last_failure"]["problems"]}
        assert got[("status", str(sup.cfg_path))]["problem"] == "must be a table" \
            and got[("status", str(sup.cfg_path))]["value"] == 3
        assert got[("status.port", "env KILN_STATUS_PORT")]["problem"].startswith("cannot be applied: status")
        assert sup.stop() == 3
    assert "Traceback" not in sup.log()


def test_exit_on_failure_keeps_the_exit_for_ci(tmp_path):
    with Supervised(tmp_path, deploy(tmp_path), env={"KILN_SERVER_PORT": "abc"}, args=("--exit-on-failure",)) as sup:
        wait_for(lambda: sup.proc.poll() is not None, 30, "the supervisor to exit")
        assert sup.proc.returncode == 2
    log = sup.log()
    assert "server.port (from env KILN_SERVER_PORT): must be an integer (got 'abc')" in log and "Traceback" not in log


def test_a_missing_config_is_explained_on_the_status_port_of_the_environment(tmp_path):
    port, missing = free_port(), tmp_path / "etc" / "deploy.toml"
    with Supervised(tmp_path, "", env={"KILN_STATUS_PORT": str(port)}, status_port=port,
                    args=("--config", str(missing))) as sup:       # the last --config wins
        st = failed(sup)
        (p,) = st["last_failure"]["problems"]
        assert (p["field"], p["problem"], p["from"]) == ("(file)", "cannot be read: No such file or directory",
                                                         str(missing))
        assert "KILN_CONFIG" in p["fix"]
        assert sup.stop() == 3


def test_a_key_pasted_into_the_config_reaches_neither_the_log_nor_the_status_page(tmp_path):
    # issue 37, "small lies": /status hid it, the boot log printed it (the problem line quoted the value)
    sport = free_port()
    text = config(binary="/bin/true", model="/models/m.gguf", port=free_port(), status_port=sport,
                  state_dir=tmp_path / "state", rungs='[[ladder.rungs]]\nname = "a"\n', api_key="sk-live-SECRETSECRET123")
    with Supervised(tmp_path, text) as sup:
        st = sup.wait_state("FAILED", timeout=30)
        assert "server.api_key" in str(st) and "SECRETSECRET" not in str(st)
        sup.stop()
        assert "SECRETSECRET" not in sup.log() and "not shown" in sup.log()
