"""The plan's arithmetic: how much memory a model takes on an engine, before anything is rented.

    shape.py    what the memory depends on, read from a GGUF header (the supervisor's own reader,
                model/gguf_layout.py) or from an hf:// safetensors repo's config.json and index:
                weights per layer and per tensor kind, which layers keep a KV cache and how wide
    kvtypes.py  bytes per element of each KV cache type (f16, q8_0, fp8, ...)
    memory.py   KV bytes per token, the engine's reserve (llama.cpp's fit margin, vLLM's
                gpu_memory_utilization and profile peak), an estimate for a context and a number
                of streams, vLLM's KV token count
    fit.py      whether an estimate is resident on N cards of M bytes each, per card, and what is not
    engine_log.py  what an engine says it allocated, from its own log (llama-server's buffers, vLLM's
                KV tokens): P17's baseline, and the self-check's measurement
    check.py    after the selftest: the deploy config's [plan] predictions beside what the boot
                measured (NVML, the engine's log, the selftest's decode), for /status and /metrics

Pure: no I/O — callers hand in a header already read, a config already parsed, log lines, NVML's
figures — so the supervisor can show predicted against measured and the workstation's `plan` can
price it.
Kept free of imports.
"""
