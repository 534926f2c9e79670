"""The model: where the file the engine loads comes from, and whether this engine can load it.

    resolve.py      a local path (model.entry may glob a shard), or the file inside a fetched snapshot
    prefetch.py     the weights read into the page cache beside the engine's start (or why not)
    fetch/          hf:// sources into the volume's cache, in a child process (its __init__ maps it)
    gguf_layout.py  a GGUF file's header: tensors, bytes per layer, hyper-parameters
    check.py        model preflight: refuse before launch a GGUF this engine build would refuse
                    (architecture, required keys, tensor names and types); `check-model`

Kept free of imports.
"""
