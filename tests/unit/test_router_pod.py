"""The router pod's parts that need no RunPod: the replica list it is given (API over each replica's
TCP port, readiness over the proxy), its CreatePodRequest (a CPU pod, valid against the vendored
schema), and what `pods status` says it routes to. The whole flow: tests/integration/test_runpod_router.py."""

import pytest

from images.router import pod as router_pod
from images.runpod_schema import check
from images.target import load_target
from supervisor.errors import KilnError

PROXY = "https://{pod_id}-{port}.proxy.runpod.net"


def replica(pid, name, ip="203.0.113.7", public=40123):
    ports = [{"private": 8082, "public": public, "type": "tcp", "ip": ip}] if ip else []
    return {"id": pid, "name": name, "runtime": {"ports": ports}}


def test_the_router_gets_each_replicas_tcp_api_and_its_ready_over_the_proxy():
    t = load_target("cpu-llamacpp")
    value = router_pod.replicas_value(t, [replica("p2", "kiln-cpu-llamacpp-2", public=40200),
                                          replica("p1", "kiln-cpu-llamacpp-1")], PROXY)
    assert value == ("http://203.0.113.7:40123|https://p1-8081.proxy.runpod.net/ready "
                     "http://203.0.113.7:40200|https://p2-8081.proxy.runpod.net/ready")


def test_a_replica_without_a_public_tcp_port_is_refused_by_name():
    with pytest.raises(KilnError) as e:
        router_pod.replicas_value(load_target("cpu-llamacpp"), [replica("p1", "kiln-cpu-llamacpp-1", ip=None)], PROXY)
    assert "kiln-cpu-llamacpp-1 (p1) has no public IP" in str(e.value) and "SECURE" in str(e.value)


def test_the_router_pod_is_a_cpu_pod_the_schema_accepts():
    body = router_pod.router_body("kiln-T-router", "tpl1", "http://a:1|https://x/ready", cpu_flavor="cpu5c",
                                  vcpu=2, cloud="SECURE", data_centers=("EU-RO-1",))
    check(body, "CreatePodRequest")              # raises, naming the field, when RunPod would refuse it
    assert body["cpu"] == {"id": "cpu5c", "vcpuCount": 2} and "gpu" not in body
    assert body["env"] == {"KILN_ROUTER_REPLICAS": "http://a:1|https://x/ready"}


def test_status_names_the_replicas_it_routes_to():
    reps = [{"id": "p1", "name": "kiln-T-1"}, {"id": "p2", "name": "kiln-T-2"}]
    snap = {"router": {"replicas": [{"url": "http://a:1", "status_url": "https://p1-8081.proxy.runpod.net/ready",
                                     "routed": True},
                                    {"url": "http://b:1", "status_url": "https://p2-8081.proxy.runpod.net/ready",
                                     "routed": False}]}}
    assert router_pod.routes(snap, reps) == "routes to 1 of 2 replica(s): kiln-T-1; not routed: kiln-T-2"
    assert router_pod.routes(None, reps) == "no answer"
    assert router_pod.router_name("T") == "kiln-T-router" and router_pod.is_router({"name": "kiln-T-router"})
