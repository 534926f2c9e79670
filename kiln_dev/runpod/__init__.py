"""A stand-in for RunPod: its REST API v2 (https://api.runpod.io/v2) and its HTTP proxy
(https://<podId>-<port>.proxy.runpod.net), on loopback, for tests. It is not RunPod.

    api.py         the v2 routes Kiln calls: templates, catalog/gpus, pods (+ logs, action),
                   network-volumes. Every request body is checked against RunPod's published
                   schema (images/schemas/runpod-rest-v2.json, read as a file and validated with
                   the jsonschema library's Draft202012Validator, not with Kiln's code), and the
                   handler rules the document states; errors are RFC 9457 problem objects
                   (ErrorResponse) with the statuses the document gives (401, 404, 400, 422).
                   Template names are kept unique (v1's documented rule; v2's document is silent).
                   Pods move PROVISIONING -> STARTING -> RUNNING (PodStatus) as their container
                   comes up; DELETE terminates (the pod leaves the list); a stop is recorded so a
                   test can prove nothing stopped a pod. Every request is logged without headers.
    containers.py  what runs "in" a pod: a real Kiln supervisor (`python -m supervisor run`) with the
                   pod's env (secret references resolved, RUNPOD_POD_ID and a pod-scoped
                   RUNPOD_API_KEY set, as RunPod does), its private ports mapped to free loopback ports.
    proxy.py       the HTTP proxy: /<podId>-<port>/... is forwarded to that pod's mapped port, for
                   ports the pod exposes as http, while the pod is RUNNING.
    serverless.py  RunPod Serverless: the /v2/serverless routes (endpoints, workers, releases, worker
                   logs) on the same server, and the scaler (workers between min and max on in-flight
                   requests, back to zero after idleTimeout; each configuration change a release).
    balancer.py    an endpoint's URL (https://<id>.api.runpod.ai/<path>): /<id>/<path> on loopback,
                   routed only to a worker whose health path answers 200, streamed through.
    clusters.py    RunPod Instant Clusters: /v2/clusters (create, list, get, delete, member pods), each
                   member a pod of this stand-in whose supervisor gets RunPod's cluster variables.
    workers.py     what runs in a serverless worker: a real supervisor with PORT, PORT_HEALTH and
                   HEALTH_CHECK_PATH, the endpoint's network volume shared at /runpod-volume.
"""

from .api import RunPodStandIn, gpu_type
from .clusters import ClusterStandIn
from .containers import SupervisorRunner
from .serverless import ServerlessStandIn, serverless_gpu
from .workers import WorkerRunner

__all__ = ["ClusterStandIn", "RunPodStandIn", "ServerlessStandIn", "SupervisorRunner", "WorkerRunner", "gpu_type", "serverless_gpu"]
