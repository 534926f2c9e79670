"""RunPod through its REST API v2 (https://api.runpod.io/v2): everything Kiln does there.

    schema.py     the vendored v2 OpenAPI excerpt and the offline check of every request body
    api.py        the v2 client (templates, catalog, pods, logs, network volumes); checks, then sends
    template.py   a target's CreateTemplateRequest, and upsert by name
    cuda.py       which host CUDA versions a target's image can run on (one function: cuda_floor)
    pods.py       up / status / logs / down: pods from a target's template, never stopped
    volumes.py    network volumes for the model cache (create or reuse by name)
    vendor.py     rewrite the vendored excerpt from a copy of RunPod's document

The command line is images/cli/pods.py and runpod.py (`python build.py pods|template`). RunPod's REST v1 is retired
(its migration guide, docs.runpod.io/api-reference-v2/migrate-from-v1); nothing here speaks it.
"""
