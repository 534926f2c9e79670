"""The engines the supervisor runs, and how one rung of one is launched and watched.

    registry.py   which engine module runs a config (get), whether its binary is in this image
    llamacpp.py   llama.cpp's llama-server  ┐ one surface each, so the lifecycle never asks
    vllm.py       vLLM's `vllm serve`        │ which engine it is (below)
    router.py     smg in front of replicas   ┘ (their feeder: supervisor/router/)
    flags.py      the engine's own --help, captured at build time: every rung is linted against it
    caches.py     compile caches (torch.compile, Triton, the driver's PTX JIT) on the state volume
    startup.py    the deploy config's [startup] levers on a boot's time, as each engine's flags
    apikey.py     the server's API key: env, file or generated into the volume; never in argv
    (run/launch.py, the shell's: a rung's checks before anything starts, the start, why it went down)
    health.py     the health wait, racing the deadline, the engine's exit and a stop

An engine module's surface:

    load_snapshot(path) -> FlagSnapshot           the engine's own --help, parsed
    lint_rung(cfg, index, rung, snapshot, gpu_count=None, *, model=None) -> list[LintIssue]
                                                  errors: the rung is refused (model: its GGUF header)
    lint_rung_warnings(cfg, index, rung, snapshot, *, model=None) -> list[LintIssue]
                                                  warnings (LintIssue.severity "warning"): it runs
    build_argv(cfg, rung, *, model_path, api_key_file, vcpus=None) -> list[str]
    boot_args(cfg, rung, *, snapshot, env, weights_bytes, gpu_free_mib, prefetched) -> (list[str], why)
                                                  flags Kiln adds for a faster boot where they are safe
                                                  (llama.cpp: --load-mode none, every layer on the GPU)
    engine_env(cfg, rung, api_key) -> dict        environment the engine must have (vLLM's key)
    engine_defaults(cfg, rung) -> dict           environment defaults the pod or rung may override (caches)
    sampler_overrides(cfg, rung, snapshot=None) -> dict
                                                  [sampler] defaults the rung sets itself (field -> how);
                                                  build_argv replaces those, one by one, and keeps the rest
    SIGNATURES, HINTS                             stderr lines that decide a failure's class
    STALL_LINES                                   (pattern, count): repeated output that is a stall
    PHASES                                        (phase, pattern): the engine's own boot phases, in the
                                                  order it prints them (run/timeline.py)

What an exit means is decided once, in run/launch.py down() with supervisor/failure.py's classify.
Kept free of imports.
"""
