"""One model across nodes: a Kiln supervisor on each node of a RunPod Instant Cluster, vLLM's own
multi-node executor between their engines, and the nodes' supervisors holding the group together.
Kiln moves no tensor and schedules nothing: vLLM (`--nnodes/--node-rank/--master-addr/--master-port`,
`--headless` on the other nodes) is the transport; this package is only the group's lifecycle.

    environment (PRIMARY_ADDR, NODE_RANK, NUM_NODES, ...)
        ─▶ cluster_env.py (base)  this node's `Node`: its rank, the primary, the deadlines
    PREFLIGHT
        ─▶ node.py      /dev/shm big enough, the cluster interface there (never eth0), an engine
                        that can span nodes, a rung that leaves the node flags to Kiln: else refused
                        with the fix
    every launch
        ─▶ engine.py    the rank's vLLM flags (rank 0 the API server, the others --headless) and
                        the interface variables (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, VLLM_HOST_IP)
        ─▶ group.py     the order: the primary launches once every other rank waits at its gate
                        with no engine; the others launch once the primary's new engine runs
    while it runs
        ─▶ group.py     every other rank beats to the primary's status port (GET /cluster?beat=...) every
                        0.5 s and reads the primary's state in the answer: a rank silent for
                        KILN_CLUSTER_LOST_S, or whose engine went down, is a loss for every rank,
                        which stops its own engine (the loop's restart, with backoff and its cap,
                        does the rest); a headless rank is up once the primary's engine is; the
                        primary's /ready waits for every rank SERVING in its epoch; while it
                        serves, the primary's real 1-token request through its own API finds an
                        engine that hangs or died under a live supervisor

The protocol (protocol.py) carries states and numbers, never a secret and never the model's data.
Kept free of imports.
"""
