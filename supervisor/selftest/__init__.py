"""The selftest: after the engine answers /health, does it answer *well*, and how fast?

TGI's warmup and SkyServe's probe only prove a server answers. The field notes show
why that is not enough: a headline tok/s measured on repetition loops, an expert count that
turned output into `# # # #`, speculation that corrupted code, a proxy that cuts long
requests. One concern per module:

    client.py      a small OpenAI-compatible client: streaming timings, wall limits, cancel
    probes.py      probe sets per model family with expected answers and severities
    lexicon.py     word lists for the language probes
    degeneracy.py  repetition loops, repeated n-grams, symbol runs, non-words
    metrics.py     the engine's own counters from /metrics (llama.cpp, vLLM)
    chunked.py     long prompts built in chunks under a wall limit, proven by cached-token counts
    measure.py     decode tok/s on coherent prose, prefill cold and warm
    report.py      the JSON report, the /status record and the table
    runner.py      one selftest, start to verdict: in full, or as the gate a Serverless worker's
                   cold start runs (probes at once, measurements sized to the floors)
    cli.py         `python -m supervisor selftest --url ...` against any server

SELFTEST as a stage (a task beside the loop, with a hard deadline) is run/selftest.py; only the
loop acts on a verdict (SELFTEST -> SERVING, or `selftest_failed`). Kept free of imports (config.py
names the probe sets, PROBE_SETS, which a test keeps equal to probes.py SETS).
"""
