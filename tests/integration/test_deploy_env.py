"""A deploy config that travels with the deployment (issue 49): `pods up --config FILE` puts the file in
the pod's environment as KILN_DEPLOY_CONFIG (base64), and the image's supervisor serves it instead of
the config it bakes, with no rebuild. Real `python -m supervisor run` processes, the real CPU
llama-server, a tiny real GGUF."""

from __future__ import annotations

import base64

import pytest

from kiln_dev.supervised import Supervised, config, free_port, http as get
from supervisor import deploy_env
from supervisor.errors import ConfigError


def _config(tmp_path, prefix, model, *, rung="carried-rung") -> str:
    return config(binary=prefix / "bin" / "llama-server", model=model, port=free_port(), status_port=free_port(),
                  state_dir=tmp_path / "state",
                  rungs=f'[[ladder.rungs]]\nname = "{rung}"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n')


@pytest.mark.llama
def test_the_carried_config_is_served_and_said_to_be_the_deployments(tmp_path, prefix, tiny):
    text = _config(tmp_path, prefix, tiny)
    with Supervised(tmp_path, text, carried=True) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert st["rung"]["name"] == "carried-rung"
        assert st["config"]["source"] == "env KILN_DEPLOY_CONFIG"
        assert sup.stop() == 0


def test_a_value_that_is_not_base64_leaves_pid_1_up_in_failed_naming_the_variable_and_the_fix(tmp_path):
    status_port = free_port()
    with Supervised(tmp_path, "unused", carried=True, status_port=status_port,
                    env={"KILN_DEPLOY_CONFIG": "engine = llamacpp !!", "KILN_STATUS_PORT": str(status_port)}) as sup:
        st = sup.wait_state("FAILED", timeout=30)
        (p,) = st["last_failure"]["problems"]
        assert p["field"] == "KILN_DEPLOY_CONFIG" and p["from"] == "env KILN_DEPLOY_CONFIG"
        assert "is not base64" in p["problem"] and "pods up --config" in p["fix"]
        assert get(sup.url("/ready"))[0] == 503
        assert sup.stop() == 3
    assert "Traceback" not in sup.log()


def test_a_carried_config_that_does_not_validate_names_its_field_and_says_to_deploy_it_again(tmp_path):
    status_port = free_port()
    bad = f'engine = "llamacpp"\n[model]\nsource = "/m.gguf"\n[status]\nport = {status_port}\n[ladder]\nfall_through = ["oom"]\n'
    bad += '[[ladder.rungs]]\nname = "a"\nargs = ["--ctx-size", "4096; rm -rf /"]\n'
    with Supervised(tmp_path, bad, carried=True, status_port=status_port) as sup:
        st = sup.wait_state("FAILED", timeout=30)
        fields = [p["field"] for p in st["last_failure"]["problems"]]
        assert any(f.startswith("ladder.rungs[0]") for f in fields), fields
        assert all("deploy it again" in p["fix"] for p in st["last_failure"]["problems"])
        assert st["config"]["source"] == "env KILN_DEPLOY_CONFIG"
        assert sup.stop() == 3


def test_beside_kiln_config_it_is_refused_never_guessed(tmp_path):
    status_port = free_port()
    text = f"[status]\nport = {status_port}\n"
    with Supervised(tmp_path, text, carried=True, status_port=status_port,
                    env={"KILN_CONFIG": "/etc/kiln/profiles/code-editing.toml",
                         "KILN_STATUS_PORT": str(status_port)}) as sup:      # as Kiln's templates set it
        st = sup.wait_state("FAILED", timeout=30)
        (p,) = st["last_failure"]["problems"]
        assert "is set beside KILN_CONFIG=/etc/kiln/profiles/code-editing.toml" in p["problem"]
        assert sup.stop() == 3


# -- the variable itself (deploy_env.py) ----------------------------------------------------------
def test_encode_and_decode_round_trip_and_bad_values_name_the_variable():
    text = 'engine = "vllm"\n# ünïcode\n'
    assert deploy_env.decode(deploy_env.encode(text)) == text
    with pytest.raises(ConfigError, match="does not decode to UTF-8"):
        deploy_env.decode(base64.b64encode(b"\xff\xfe not text").decode())
    with pytest.raises(ConfigError, match="at most"):
        deploy_env.decode(base64.b64encode(b"#" * (deploy_env.MAX_BYTES + 1)).decode())


def test_which_config_a_boot_runs():
    default = "/etc/kiln/deploy.toml"
    carried = deploy_env.encode("# the deployment's\n")
    assert deploy_env.choose(None, {}, default) == (default, None)
    assert deploy_env.choose(None, {"KILN_CONFIG": "/p.toml"}, default) == ("/p.toml", None)
    assert deploy_env.choose(None, {"KILN_DEPLOY_CONFIG": carried}, default) == ("env KILN_DEPLOY_CONFIG",
                                                                               "# the deployment's\n")
    assert deploy_env.choose("/given.toml", {"KILN_DEPLOY_CONFIG": carried}, default) == ("/given.toml", None)
    assert deploy_env.choose(None, {"KILN_DEPLOY_CONFIG": "  "}, default) == (default, None)
