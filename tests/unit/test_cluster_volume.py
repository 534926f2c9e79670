"""A cluster's nodes on one state_dir (one network volume mounted on every node, issue 40: "the model
is downloaded once per node (or once per shared volume when mounted)"): each node keeps its own
state in a directory of its own, named by its pod id, and shares the Hub cache and the compile
caches (supervisor/run/runtime.py own_state_dir, supervisor/runpod_env.py "The volume"). `cluster
plan|up --volume` mounts one existing network volume on every node, the state_dir on it, in a body
valid against RunPod's CreateClusterRequest (images/runpod/clusters.py NetworkMount)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from images.pins.lock import load_lock, pins_for
from images.runpod import clusters, template
from images.target import load_target
from kiln_dev.loopback_cluster import node_deploy, node_env
from supervisor.config import parse_config
from supervisor.engines import vllm
from supervisor.errors import KilnError
from supervisor.model.fetch.layout import cache_dir
from supervisor.run import loop
from supervisor.run.launch import engine_environment


def node(tmp: Path, rank: int, **env: str) -> loop.Supervisor:
    """Node `rank` of a 2-node loopback cluster whose state_dir is tmp/state (the shared volume)."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    text = node_deploy(tmp, model=model, binary=Path("/usr/bin/true"), snapshot=tmp / "help.txt", port=8000,
                       sport=8081, boot_s=60)
    cfg = parse_config(text, env={})
    return loop.Supervisor(cfg, loop.Options(env={**node_env(rank, nodes=2, master_port=29501, group_port=8091),
                                                  **env}, status=False))


def test_a_cluster_node_keeps_its_own_state_in_a_directory_named_by_its_pod_id(tmp_path):
    shared = tmp_path / "state"
    sup = node(tmp_path, 1, RUNPOD_POD_ID="pod-b7x")
    own = shared / "workers/pod-b7x"
    assert sup.state_dir == own and sup.rt.state_dir == own
    assert sup.rt.run_dir == own / "run"                         # engine.log, the children journal, the key file
    assert sup.memory.path == own / "ladder-memory.json"
    assert sup.reloads.book.root == own / "reload"
    assert sup.rt.shared == shared                               # the generated API key: one for every node


def test_two_nodes_on_one_host_get_two_directories():
    # The loopback cluster's nodes share a host (one hostname): each is given a pod id of its own.
    ids = {node_env(r, nodes=2, master_port=1, group_port=2)["RUNPOD_POD_ID"] for r in (0, 1)}
    assert len(ids) == 2


def test_a_cluster_node_shares_the_hub_cache_and_the_compile_caches_but_not_the_driver_jit_cache(tmp_path):
    shared = tmp_path / "state"
    sup = node(tmp_path, 0, RUNPOD_POD_ID="pod-a1")
    cfg = sup.boot_cfg
    assert cache_dir(cfg) == shared / "hf"                       # fetched once, under the volume's lock
    env = engine_environment(vllm, cfg, cfg.ladder.rungs[0], {}, None, own_dir=sup.rt.state_dir)
    assert env["VLLM_CACHE_ROOT"] == str(shared / "cache/vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared / "cache/torchinductor")
    assert env["CUDA_CACHE_PATH"] == str(shared / "workers/pod-a1/cache/cuda-jit")


def test_a_pod_outside_a_cluster_keeps_its_state_in_state_dir_itself(tmp_path):
    sup = node(tmp_path, 0, NUM_NODES="1", RUNPOD_POD_ID="pod-solo")
    assert sup.state_dir == tmp_path / "state"


# -- `cluster plan|up --volume`: one network volume on every node ---------------------------------------
KIMI = "b200-vllm"            # a cluster target: [runpod] volume_gb 1800 at /workspace, state_dir under it
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "images/schemas/runpod-rest-v2.json").read_text())


def plan(volume: str | None, path: str | None = None) -> dict:
    target = load_target(KIMI)
    tpl = template.build_template(target, pins_for(target, load_lock()))
    mount = clusters.NetworkMount.of(target, volume, path) if volume is not None else None
    return clusters.cluster_body(target, tpl, clusters.Shape.of(target, nodes=2), mount)


def valid(body: dict) -> list[str]:
    """The body against the vendored CreateClusterRequest, read by the jsonschema library (not Kiln's code)."""
    root = {"$ref": "#/components/schemas/CreateClusterRequest", "components": SCHEMA["components"]}
    return [e.message for e in jsonschema.Draft202012Validator(root).iter_errors(body)]


def test_the_plan_with_a_volume_mounts_it_on_every_node_in_place_of_the_persistent_disk_and_validates():
    assert plan(None)["mounts"] == {"persistent": {"size": 1800, "path": "/workspace"}}
    body = plan("agv6w2qcg7")
    assert body["mounts"] == {"network": [{"volumeId": "agv6w2qcg7", "path": "/workspace"}]}
    assert valid(body) == []
    assert "KILN_STATE_DIR" not in body["env"]             # the deploy config's /workspace/kiln is on the volume


def test_a_volume_elsewhere_moves_the_state_dir_onto_it():
    body = plan("agv6w2qcg7", "/runpod-volume")
    assert body["mounts"] == {"network": [{"volumeId": "agv6w2qcg7", "path": "/runpod-volume"}]}
    assert body["env"]["KILN_STATE_DIR"] == "/runpod-volume/kiln" and valid(body) == []


@pytest.mark.parametrize("volume, path, said", [
    ("", None, "--volume ''"), ("a b", None, "--volume 'a b'"),
    ("agv6w2qcg7", "runpod-volume", "--volume-path 'runpod-volume'"),
    ("agv6w2qcg7", "/", "--volume-path '/'"), ("agv6w2qcg7", "/a/../b", "--volume-path '/a/../b'")])
def test_a_bad_volume_or_path_is_refused_naming_the_flag_and_the_fix(volume, path, said):
    with pytest.raises(KilnError) as e:
        plan(volume, path)
    assert said in str(e.value) and ("e.g. /runpod-volume" in str(e.value) or "GET /v2/network-volumes" in str(e.value))
