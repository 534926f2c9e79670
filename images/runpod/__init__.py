"""RunPod through its REST API v2 (https://api.runpod.io/v2): everything Kiln does there.

    (images/runpod_schema.py, a leaf: the vendored v2 OpenAPI excerpt and the offline check of every body)
    api.py        the v2 client (templates, catalog, pods, logs, network volumes); checks, then sends
    template.py   a target's CreateTemplateRequest, and upsert by name
    cuda.py       which host CUDA versions a target's image can run on (one function: cuda_floor)
    pods.py       up / status / logs / down: pods from a target's template, never stopped
    volumes.py    network volumes for the model cache (create or reuse by name)
    endpoint.py   a target's serverless load-balancing endpoint (CreateEndpointRequest)
    endpoints.py  serverless catalog check, endpoint create-or-update by name, restore body, price, down
    rollout.py    `endpoint up --wait`: wake a worker, follow the release, the failing worker's cause
    vendor.py     rewrite the vendored excerpt from a copy of RunPod's document

The command line is images/cli/pods.py, runpod.py and endpoint.py (`python build.py pods|template|endpoint`).
RunPod's REST v1 is retired (its migration guide, docs.runpod.io/api-reference-v2/migrate-from-v1);
nothing here speaks it.
"""
