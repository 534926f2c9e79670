"""A pod that can never serve stops billing: supervisor/fleet/self_terminate.py terminates its own pod through
RunPod's REST API v2, against kiln_dev/runpod (a stand-in for RunPod's v2 API, not RunPod: it
checks the schema, answers RFC 9457 problems and accepts a pod-scoped key for its own pod only)."""

import json
import logging
import time

import pytest

from supervisor.fleet import self_terminate as runpod_self
from supervisor.config import SelfTerminateSpec, parse_config
from kiln_dev.runpod import RunPodStandIn
from kiln_dev.supervised import wait_for

ACCOUNT_KEY = "rpa_account-canary-41d9"
FAILURE = "config_rejected: hardware does not match the config: 1 GPU expected, 0 found"


@pytest.fixture
def standin():
    with RunPodStandIn(ACCOUNT_KEY) as s:
        yield s
    assert s.faults == []


def a_pod(standin):
    """A pod as RunPod runs it: its id and the pod-scoped key RunPod puts in its env."""
    from images.runpod.api import RunPodAPI

    api = RunPodAPI(ACCOUNT_KEY, standin.url)
    pod = api.create_pod({"name": "kiln-test-1", "image": "ghcr.io/kiln-llm/kiln:x", "gpu": {"id": "NVIDIA A40"}})
    wait_for(lambda: standin.pods[pod["id"]]["status"] == "RUNNING", 10, "the pod RUNNING")
    return pod["id"], standin.pods[pod["id"]]["_key"]


def pod_env(standin, pod_id, key):
    """A pod's environment: RunPod's id and key, and the stand-in named where only the image's own
    environment may name one (a deploy config may name only RunPod's API)."""
    return {"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": key, "KILN_RUNPOD_API_URL": standin.url}


def spec(standin, on=True, grace=0.2):
    return SelfTerminateSpec(terminate_on_terminal_failure=on, terminate_grace_s=grace, api_url=standin.url)


def test_with_the_option_on_a_terminal_failure_terminates_its_own_pod_after_the_grace(standin, caplog):
    pod_id, key = a_pod(standin)
    events = []
    caplog.set_level(logging.INFO, logger="kiln")
    started = time.monotonic()
    handle = runpod_self.arm(spec(standin, grace=0.5), pod_env(standin, pod_id, key),
                             failure=FAILURE, on_event=lambda e, d: events.append((e, d)))
    # arm() returned at once: the pod is still there, nothing sent yet (the caller's loop, and
    # /status with it, keep running through the grace).
    assert handle is not None and handle.outcome is None and pod_id in standin.pods
    assert not [r for r in standin.requests if r["method"] == "DELETE"]
    assert time.monotonic() - started < 0.5
    assert handle.wait(20) == "terminated"
    assert pod_id in standin.terminated and pod_id not in standin.pods and not standin.stopped
    (delete,) = [r for r in standin.requests if r["method"] == "DELETE"]
    assert delete["path"] == f"/v2/pods/{pod_id}" and delete["auth"] == f"pod:{pod_id}"   # the pod's own key
    assert not [r for r in standin.requests if r["path"].endswith("/action")], "terminated, never stopped"
    assert [e for e, _ in events] == ["runpod_terminate_armed", "runpod_terminated"]
    assert "config_rejected" in events[0][1] and "terminating pod" in caplog.text
    assert key not in caplog.text + repr(events) + repr(handle.to_dict())


def test_with_the_option_off_nothing_is_sent_and_the_pod_keeps_running(standin):
    pod_id, key = a_pod(standin)
    before = len(standin.requests)
    assert runpod_self.arm(spec(standin, on=False), pod_env(standin, pod_id, key),
                           failure=FAILURE) is None
    assert len(standin.requests) == before and standin.pods[pod_id]["status"] == "RUNNING"


@pytest.mark.parametrize("env,missing", [
    ({"RUNPOD_POD_ID": "abc"}, "RUNPOD_API_KEY is not set"),
    ({"RUNPOD_API_KEY": "k"}, "RUNPOD_POD_ID is not set"),
    ({}, "RUNPOD_POD_ID and RUNPOD_API_KEY are not set"),
    ({"RUNPOD_POD_ID": "../templates", "RUNPOD_API_KEY": "k"}, "is not a pod id"),
])
def test_without_a_pod_id_or_a_key_a_clear_warning_and_nothing_sent(standin, caplog, env, missing):
    events = []
    before = len(standin.requests)
    assert runpod_self.arm(spec(standin), env, failure=FAILURE, on_event=lambda e, d: events.append((e, d))) is None
    assert missing in caplog.text and events[0][0] == "runpod_terminate_skipped"
    assert len(standin.requests) == before


def test_a_recovery_before_the_grace_ends_cancels_and_keeps_the_pod(standin):
    pod_id, key = a_pod(standin)
    handle = runpod_self.arm(spec(standin, grace=30), pod_env(standin, pod_id, key),
                             failure=FAILURE)
    assert handle.cancel() is True
    assert handle.wait(5) == "cancelled"
    assert pod_id in standin.pods and not [r for r in standin.requests if r["method"] == "DELETE"]


def test_errors_are_retried_and_never_carry_the_key(standin, caplog, monkeypatch):
    monkeypatch.setattr(runpod_self, "BACKOFF_S", 0.05)
    pod_id, key = a_pod(standin)
    standin.fail_next = (500, "upstream failed while handling $AUTH")     # echoes the Authorization header
    handle = runpod_self.arm(spec(standin, grace=0), pod_env(standin, pod_id, key),
                             failure=FAILURE)
    assert handle.wait(20) == "terminated"
    assert "attempt 1 of 5 failed: HTTP 500" in caplog.text and "***" in caplog.text
    assert key not in caplog.text


def test_a_key_that_may_not_terminate_says_what_to_do_and_stops_trying(standin, caplog):
    pod_id, _ = a_pod(standin)
    other_id, other_key = a_pod(standin)       # another pod's scoped key: 403 for this pod
    handle = runpod_self.arm(spec(standin, grace=0), pod_env(standin, pod_id, other_key),
                             failure=FAILURE)
    outcome = handle.wait(20)
    assert outcome.startswith("failed: HTTP 403") and "[runpod.secrets] RUNPOD_API_KEY" in caplog.text
    assert len([r for r in standin.requests if r["method"] == "DELETE"]) == 1
    assert pod_id in standin.pods and other_id in standin.pods and other_key not in caplog.text


def test_the_runpod_table_defaults_validation_and_env_override():
    base = '[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\nname = "a"\n'
    cfg = parse_config(base)
    assert cfg.runpod == SelfTerminateSpec() and cfg.runpod.terminate_on_terminal_failure is False
    assert parse_config(base, env={"KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": "true"}).runpod \
        .terminate_on_terminal_failure is True
    # Not part of what runs: the config's hash ignores it (as [watch]).
    assert parse_config(base + "[runpod]\nterminate_on_terminal_failure = true\n").hash == cfg.hash
    with pytest.raises(Exception) as e:
        parse_config(base + '[runpod]\nterminate_on_terminal_failure = "yes"\nterminate_grace_s = -1\n'
                            'api_url = "ftp://x"\nterminate_grace = 3\n')
    for part in ("runpod.terminate_on_terminal_failure: must be true or false",
                 "runpod.terminate_grace_s: is out of range", "runpod.api_url: has the wrong form",
                 "runpod.terminate_grace: is not a known field; did you mean 'terminate_grace_s'?"):
        assert part in str(e.value), part


@pytest.mark.parametrize("url,env_url,why", [
    ("http://attacker.example/v2", None, "must be RunPod's API, https://api.runpod.io/v2"),
    ("https://attacker.example/v2", None, "must be RunPod's API"),
    ("http://127.0.0.1:9/v2", None, "named in the image's or pod's environment (KILN_RUNPOD_API_URL)"),
    ("https://api.runpod.io.attacker.example/v2", None, "must be RunPod's API"),
    ("https://api.runpod.io:8443/v2", None, "must be RunPod's API"),
    ("https://api.runpod.io/v1", None, "must be RunPod's API"),
    (None, "http://attacker.example/v2", "runpod.api_url (from env KILN_RUNPOD_API_URL): must be https, or http "
                                         "on loopback"),
])
def test_the_runpod_key_goes_only_to_runpods_api_or_a_stand_in_the_environment_names(url, env_url, why):
    base = '[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\nname = "a"\n'
    text = base + (f'[runpod]\napi_url = "{url}"\n' if url else "")
    with pytest.raises(Exception) as e:
        parse_config(text, env={"KILN_RUNPOD_API_URL": env_url} if env_url else {})
    assert why in str(e.value) and "runpod.api_url" in str(e.value)


def test_runpods_api_in_a_config_and_a_stand_in_in_the_environment_are_accepted():
    base = '[model]\nsource = "/m.gguf"\n[ladder]\n[[ladder.rungs]]\nname = "a"\n'
    assert parse_config(base + '[runpod]\napi_url = "https://api.runpod.io/v2/"\n', env={}).runpod.api_url \
        == "https://api.runpod.io/v2/"
    for stand_in in ("http://127.0.0.1:8123/v2", "http://localhost:8123/v2", "http://[::1]:8123/v2",
                     "https://runpod-stand-in.internal/v2"):
        assert parse_config(base, env={"KILN_RUNPOD_API_URL": stand_in}).runpod.api_url == stand_in


class Recorder:
    """An HTTP server that answers 204 to anything and keeps what it was sent: where a hostile
    published config would send the pod's RunPod key."""

    def __init__(self):
        import http.server
        import threading

        seen = self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization")})
                self.send_response(204)
                self.end_headers()
            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _any

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v2"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_arm_never_sends_the_key_to_a_url_neither_runpod_nor_the_environment_names(standin):
    # The config refuses such a URL; arm() refuses it too, where the key would leave the pod.
    pod_id, key = a_pod(standin)
    attacker = Recorder()
    try:
        events = []
        bad = SelfTerminateSpec(terminate_on_terminal_failure=True, terminate_grace_s=0, api_url=attacker.url)
        assert runpod_self.arm(bad, pod_env(standin, pod_id, key), failure=FAILURE,
                               on_event=lambda e, d: events.append((e, d))) is None
        assert events[0][0] == "runpod_terminate_skipped" and "must be RunPod's API" in events[0][1]
        assert attacker.requests == [] and pod_id in standin.pods
    finally:
        attacker.close()


@pytest.mark.llama
def test_a_published_runpod_api_url_is_rejected_by_name_and_a_later_failure_sends_the_key_only_to_runpod(
        standin, tmp_path, prefix, tiny):
    # The reproduction: whoever can write the watched config directory publishes the running config
    # with only [runpod] api_url changed. Was: judged "unchanged" (the hash leaves [runpod] out), saved
    # as the last good config, booted from at the next container start, and on that boot's terminal
    # failure the pod's RUNPOD_API_KEY went to the attacker's URL.
    import shutil

    from kiln_dev.supervised import Supervised, config, free_port, http

    pod_id, key = a_pod(standin)
    attacker = Recorder()
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny, model)
    watch_dir = tmp_path / "published"
    watch_dir.mkdir()
    state = tmp_path / "state"
    text = config(binary=str(prefix / "bin/llama-server"), model=str(model), port=free_port(), status_port=free_port(),
                  state_dir=state, snapshot=str(prefix / "share/kiln/llama-server.help.txt"),
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n',
                  extra=f'[watch]\ndir = "{watch_dir}"\ndebounce_s = 0.05\n'
                        '[runpod]\nterminate_on_terminal_failure = true\nterminate_grace_s = 0.5\n')
    hostile = text.replace("terminate_grace_s = 0.5\n", f'terminate_grace_s = 0.5\napi_url = "{attacker.url}"\n')
    try:
        with Supervised(tmp_path, text, env=pod_env(standin, pod_id, key)) as sup:
            first = sup.wait_state("SERVING", timeout=60)
            (watch_dir / ".deploy.toml.tmp").write_text(hostile)
            (watch_dir / ".deploy.toml.tmp").rename(watch_dir / "deploy.toml")
            wait_for(lambda: ((sup.status() or {}).get("reload") or {}).get("last"), 30, "the reload decision")
            st = sup.status()
            rej = st["reload"]["last"]
            assert rej["outcome"] == "rejected", rej
            assert any(p.startswith("[runpod]: cannot be changed by a published config") and
                       "Change it in the image's config" in p for p in rej["problems"]), rej["problems"]
            assert st["reload"]["last_rejection"] == rej
            assert st["state"] == "SERVING" and st["config"]["hash"] == first["config"]["hash"]
            assert not (state / "reload" / "last-good.toml").exists(), "a rejected config was saved as last good"
            history = (state / "reload" / "history.jsonl").read_text()
            assert '"outcome": "rejected"' in history and "[runpod]" in history
            assert sup.stop() == 0
        # The next container start, where the engine can no longer load: FAILED for good, and the pod
        # terminated through the stand-in its environment names -- nothing reaches the attacker.
        model.unlink()
        with Supervised(tmp_path, text, env=pod_env(standin, pod_id, key)) as sup:
            st = sup.wait_state("FAILED", timeout=60)
            assert st["config"]["from"] == "boot"
            wait_for(lambda: pod_id in standin.terminated, 30, "the pod terminated")
            assert http(sup.url("/live"))[0] == 200
            assert key not in sup.log() and key not in json.dumps(sup.status())
            assert sup.stop() == 3
        assert attacker.requests == [], attacker.requests
        (delete,) = [r for r in standin.requests if r["method"] == "DELETE"]
        assert delete["path"] == f"/v2/pods/{pod_id}" and delete["auth"] == f"pod:{pod_id}"
    finally:
        attacker.close()


@pytest.mark.llama
@pytest.mark.parametrize("on", [True, False])
def test_a_real_supervisor_that_can_never_serve_terminates_its_pod_only_with_the_option_on(standin, tmp_path,
                                                                                          prefix, on):
    # The whole road: `python -m supervisor run` FAILED (its model is not there), /status readable
    # through the grace, then DELETE /v2/pods/{id} with the pod's own key -- or nothing, option off.
    from kiln_dev.supervised import Supervised, config, free_port, http

    pod_id, key = a_pod(standin)
    text = config(binary=str(prefix / "bin/llama-server"), model=str(tmp_path / "not-there.gguf"), port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state",
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n',
                  extra=f'[runpod]\nterminate_on_terminal_failure = {str(on).lower()}\nterminate_grace_s = 1.0\n')
    with Supervised(tmp_path, text, env=pod_env(standin, pod_id, key)) as sup:
        st = sup.wait_state("FAILED")
        assert st["last_failure"]["class"] == "load_error"
        if on:
            assert st["runpod_terminate"]["pod"] == pod_id
            wait_for(lambda: pod_id in standin.terminated, 30, "the pod terminated")
            assert http(sup.url("/live"))[0] == 200          # the supervisor itself still answers
        else:
            assert "runpod_terminate" not in st
            wait_for(lambda: (sup.status() or {}).get("uptime_s", 0) > 2.5, 10, "past the grace it would have had")
            assert pod_id in standin.pods and not [r for r in standin.requests if r["method"] == "DELETE"]
        assert key not in sup.log() and key not in json.dumps(sup.status())
        assert sup.stop() == 3


def test_a_boot_config_that_does_not_validate_still_terminates_its_pod_when_the_environment_asks(standin, tmp_path):
    # Was: one typo in the pod's environment and PID 1 exited at once, before anything could
    # terminate the pod: RunPod restarted the container into the same failure, billing by the hour.
    # Now FAILED stays up to explain, and the pod goes after the grace ([runpod] of the file, valid
    # on its own although the config as a whole is not).
    from kiln_dev.supervised import Supervised, config, free_port, http

    pod_id, key = a_pod(standin)
    text = config(binary="/opt/kiln/engine/bin/llama-server", model="/models/never-read.gguf", port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state",
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n',
                  extra="[runpod]\nterminate_grace_s = 0.5\n")
    env = {**pod_env(standin, pod_id, key), "KILN_RUNPOD_TERMINATE_ON_TERMINAL_FAILURE": "true",
           "KILN_SERVER_PORT": "abc"}
    with Supervised(tmp_path, text, env=env) as sup:
        st = sup.wait_state("FAILED")
        assert st["last_failure"]["problems"][0]["from"] == "env KILN_SERVER_PORT"
        wait_for(lambda: pod_id in standin.terminated, 30, "the pod terminated")
        wait_for(lambda: ((sup.status() or {}).get("runpod_terminate") or {}).get("outcome") == "terminated", 10,
                 "/status to say the pod is terminated")
        assert http(sup.url("/live"))[0] == 200          # the supervisor itself still answers
        assert key not in sup.log() and key not in json.dumps(sup.status())
        assert sup.stop() == 3
    (delete,) = [r for r in standin.requests if r["method"] == "DELETE"]
    assert delete["path"] == f"/v2/pods/{pod_id}" and delete["auth"] == f"pod:{pod_id}"
    assert not standin.stopped


def test_a_boot_config_that_does_not_validate_keeps_its_pod_without_the_option(standin, tmp_path):
    from kiln_dev.supervised import Supervised, config, free_port

    pod_id, key = a_pod(standin)
    text = config(binary="/opt/kiln/engine/bin/llama-server", model="/models/never-read.gguf", port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state",
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n',
                  extra="[runpod]\nterminate_grace_s = 0\n")
    with Supervised(tmp_path, text, env={**pod_env(standin, pod_id, key), "KILN_SERVER_PORT": "abc"}) as sup:
        st = sup.wait_state("FAILED")
        assert "runpod_terminate" not in st
        wait_for(lambda: (sup.status() or {}).get("uptime_s", 0) > 1.5, 10, "past a grace of 0 s")
        assert pod_id in standin.pods and not [r for r in standin.requests if r["method"] == "DELETE"]
        assert sup.stop() == 3
