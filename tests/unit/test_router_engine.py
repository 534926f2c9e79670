"""The router as a deploy config and an engine: [router] read with every problem at once, smg's argv
(the key never in it), the reconciliation of replicas with smg's workers, and what the launcher says
when the router's Python has no smg. The real router: tests/integration/test_router.py."""

import subprocess
import sys

import pytest

from supervisor.config import ReplicaSpec, parse_config, replica_urls
from supervisor.engines import router as engine
from supervisor.errors import ConfigError
from supervisor.failure import FailureClass, classify
from supervisor.router.launch import split
from supervisor.router.plan import Worker, reconcile, routed

ROUTER = """engine = "router"
[server]
port = 9000
[router]
policy = "round_robin"
[[router.replicas]]
url = "http://127.0.0.1:8080/"
status_url = "http://127.0.0.1:8081"
[[router.replicas]]
url = "http://127.0.0.1:8090"
"""


def test_a_router_config_needs_no_model_ladder_or_selftest():
    c = parse_config(ROUTER, env={})
    assert c.engine == "router" and c.model.source == "" and c.selftest.enabled is False
    assert [r.name for r in c.ladder.rungs] == ["router"]
    assert c.router.replicas == (ReplicaSpec("http://127.0.0.1:8080", "http://127.0.0.1:8081/ready"),
                                 ReplicaSpec("http://127.0.0.1:8090", "http://127.0.0.1:8090/health"))
    assert c.router.policy == "round_robin" and c.server.binary == "/opt/kiln/venv/bin/python3"


def test_status_urls_ask_kiln_ready_or_a_server_health():
    assert replica_urls("http://a:1", None) == ReplicaSpec("http://a:1", "http://a:1/health")
    assert replica_urls("http://a:1/", "http://a:2/") == ReplicaSpec("http://a:1", "http://a:2/ready")
    assert replica_urls("http://a:1", "http://a:1/healthz").status_url == "http://a:1/healthz"


def test_every_router_problem_is_named_at_once():
    bad = """engine = "router"
[model]
source = "/m.gguf"
[ladder]
[[ladder.rungs]]
name = "a"
[selftest]
enabled = true
[server]
extra_args = ["-t", "1"]
[router]
policy = "fastest"
metrics_port = 8081
extra_args = ["--api-key", "k", "--log-json"]
[[router.replicas]]
url = "ftp://x"
[[router.replicas]]
url = "http://b:1/v1"
[[router.replicas]]
url = "http://c:1"
[[router.replicas]]
url = "http://c:1/"
"""
    with pytest.raises(ConfigError) as e:
        parse_config(bad, env={})
    where = [p.path for p in e.value.problems]
    assert where == ["model", "selftest.enabled", "ladder", "router.replicas[0].url", "router.replicas[1].url",
                     "router.replicas[3].url", "router.policy", "router.extra_args[0]", "server.extra_args",
                     "router.metrics_port"], where
    text = str(e.value)
    assert "serves no model of its own" in text and "http://b:1" in text and "set by the supervisor" in text


def test_router_table_belongs_to_the_router_only():
    with pytest.raises(ConfigError) as e:
        parse_config('[model]\nsource = "/m"\n[ladder]\n[[ladder.rungs]]\nname = "a"\n[router]\n', env={})
    assert [p.path for p in e.value.problems] == ["router"]


def test_replicas_from_the_environment():
    c = parse_config('engine = "router"\n', env={"KILN_ROUTER_REPLICAS": "http://a:1|http://a:2 http://b:1"})
    assert c.router.replicas == (ReplicaSpec("http://a:1", "http://a:2/ready"),
                                 ReplicaSpec("http://b:1", "http://b:1/health"))


def test_argv_names_the_key_file_never_the_key():
    c = parse_config(ROUTER + '\n', env={})
    argv = engine.build_argv(c, c.ladder.rungs[0], api_key_file="/run/key")
    assert argv[:5] == ["/opt/kiln/venv/bin/python3", "-m", "supervisor.router.launch", "--key-file", "/run/key"]
    smg = argv[argv.index("--") + 1:]
    # smg on loopback behind the gate on server.port (router/front.py), never on the clients' port itself
    assert smg[:6] == ["--host", "127.0.0.1", "--port", "29080", "--policy", "round_robin"]
    assert c.engine_address == ("127.0.0.1", 29080) and c.server.port == 9000
    # smg's 5 s listener hold and its drain fit in the stop grace: smg exits before the SIGKILL
    assert c.health.stop_grace_s >= 30 and smg[smg.index("--shutdown-grace-period-secs") + 1] == "30"
    assert "--balance-abs-threshold" not in smg                 # round_robin has no spill gate to tune
    ca = parse_config(ROUTER.replace('policy = "round_robin"', 'extra_args = ["--balance-abs-threshold", "3"]'),
                      env={})
    ca_argv = engine.build_argv(ca, ca.ladder.rungs[0])
    gate = [ca_argv[i + 1] for i, a in enumerate(ca_argv) if a == "--balance-abs-threshold"]
    assert gate == ["2", "3"] and ca_argv[ca_argv.index("--balance-rel-threshold") + 1] == "1.5"   # extra_args win
    assert "--api-key" not in argv and "--worker-urls" not in argv
    assert smg[smg.index("--prometheus-host") + 1] == "127.0.0.1"
    assert split(argv[3:]) == ("/run/key", smg)
    assert split(["--", "--port", "1"]) == (None, ["--port", "1"])


def test_reconcile_adds_ready_replicas_and_removes_the_rest():
    ready = {"http://a:1": True, "http://b:1": False, "http://c:1": True, "http://d:1": True}
    workers = [Worker("http://a:1/", "wa", "ready"), Worker("http://b:1", "wb", "ready"),
               Worker("http://c:1", "wc", "draining"), Worker("http://gone:1", "wg", "not_ready"),
               Worker("http://old:1", "wo", "draining")]
    plan = reconcile(ready, workers)
    assert plan.add == ("http://c:1", "http://d:1")            # c is on its way out: add it again
    assert [w.id for w in plan.remove] == ["wb", "wg"]         # not ready, not configured; draining left alone
    assert routed(ready, workers) == ["http://a:1"]


def test_a_pending_or_sick_worker_is_smg_business():
    ready = {"http://a:1": True, "http://b:1": True}
    workers = [Worker("http://a:1", "wa", "pending"), Worker("http://b:1", "wb", "not_ready")]
    plan = reconcile(ready, workers)
    assert plan.add == () and plan.remove == () and routed(ready, workers) == []


def test_a_python_without_smg_is_engine_missing(tmp_path):
    # This test's Python may have smg (CI installs the dev extra): hide it with an empty site.
    code = ("import sys; sys.modules['smg'] = None; sys.modules['smg.launch_router'] = None; "
            "from supervisor.router.launch import main; sys.exit(main(['--', '--port', '1']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 127
    failure = classify(returncode=out.returncode, elapsed_s=0.1, tail=out.stderr.splitlines(),
                       signatures=engine.SIGNATURES)
    assert failure.failure_class == FailureClass.ENGINE_MISSING, out.stderr
    assert "pip install smg==1.13.0" in out.stderr.replace(f"{sys.executable} -m ", "")


def test_lint_checks_extra_args_against_a_snapshot_when_there_is_one():
    from supervisor.engines.flags import parse_argparse_help

    snap = parse_argparse_help("  --log-json            Output logs in JSON\n  --cache-threshold CACHE_THRESHOLD\n")
    c = parse_config(ROUTER.replace('policy = "round_robin"', 'extra_args = ["--log-jsn", "--cache-threshold", "0.5"]'),
                     env={})
    issues = engine.lint_rung(c, 0, c.ladder.rungs[0], snap)
    assert [str(i) for i in issues] == [
        "router.extra_args[0]: --log-jsn is not a flag of this smg (did you mean --log-json?)"]
    assert engine.lint_rung(c, 0, c.ladder.rungs[0], None) == []


def test_the_router_refuses_to_start_only_when_no_replica_accepts_its_key():
    from supervisor.router.keycheck import ACCEPTED, NO_VERDICT, REFUSED, refusal

    refused, silent = (REFUSED, "401"), (NO_VERDICT, "no answer (ConnectionRefusedError)")
    assert refusal({}, has_key=True) is None                                      # nothing to ask
    assert refusal({"http://a:1": silent}, has_key=True) is None                  # still starting: no verdict
    assert refusal({"http://a:1": refused, "http://b:1": (ACCEPTED, "200")}, has_key=True) is None
    why = refusal({"http://a:1": refused, "http://b:1": silent}, has_key=True)
    assert "http://a:1 answered 401" in why and "kiln_api_key" in why
    assert "has none" in refusal({"http://a:1": refused}, has_key=False)
    c = parse_config(ROUTER + '\n', env={})
    argv = engine.build_argv(c, c.ladder.rungs[0], api_key_file="/run/key")
    assert argv[argv.index("--replica") + 1] == "http://127.0.0.1:8080" and argv.count("--replica") == 2
