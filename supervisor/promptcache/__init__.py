"""The engine's prompt cache, kept across the restarts Kiln makes (issue 51).

A warm prompt cache is what users value most of a running engine: the field notes re-submitted a cached
32k prompt to Kimi-K3 in 0.6 s against ~230 s cold. Every engine restart Kiln makes threw it away. For
llama.cpp (`llama-server --slot-save-path DIR`, `POST /slots/{id}?action=save|restore`) the supervisor now
saves the slots that hold a prompt worth keeping before it stops an engine, and restores them into the
next one before /ready turns 200:

    stop (reload, rollback, TERM, a group restart)        next engine healthy, selftest passed
    ──────────────────────────────────────────────        ─────────────────────────────────────
    slots.save_all: each slot saved to <key>.<tag>.partial  store.candidates: this key's entries, newest
    store.keep: a slot of >= min_tokens tokens becomes      first (a file of another key: skipped, counted)
      <key>-<tag>-<slot>.bin + .json (its manifest), whole  slots.restore: into slots 0.., each checked
      or not at all; the rest deleted; the store bounded     (n_restored = the manifest's tokens)
      in bytes and entries, oldest first

    key.py     what makes a KV cache valid: the model file, the engine build, and every flag that changes
               the computation (context, KV types, batch, parallel slots, RoPE, ...): any difference, another key
    slots.py   the engine's slot API: list, save, restore (its own HTTP, the server's key)
    store.py   the directory: manifests, bounds, eviction, what is offered to a new engine

Where the files live: <state_dir>/prompt-cache on a pod (on the network volume where there is one), the
endpoint's shared directory for a Serverless worker, so a worker scaled from zero restores what an
earlier worker of the same endpoint saved. `[cache]` (config.CacheSpec) turns it off and bounds it.
What a SIGKILL loses: the save that was under way (a .partial, deleted at the next save). A crash
saves nothing (the engine is gone); the last save stays.

vLLM: nothing in the pinned vLLM keeps prefix-cache blocks across a restart without an external KV
connector service (docs/supervisor.md, "The prompt cache"); the switch has no effect there.
"""
