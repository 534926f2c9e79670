"""Building an image: target + lock -> Dockerfile and context -> an image with an immutable tag.

    render.py          RenderContext (one typed object) -> Jinja (StrictUndefined; `dq` for ENV/LABEL,
                       `shq` for RUN lines) -> Dockerfile + build context
    outdir.py          `render --out DIR`: only Kiln's own files, resumable, never deleting a file
    engine_facts.py    what a pinned llama.cpp knows about GGUF files, and where a target's facts are
    docker.py          the Docker engine: is one there, BuildKit builds with secrets, push
    tags.py            immutable release tags and CI's staging tags
    layers.py          two builds of an image, layer by layer (`compare-images`: does a rebuild reproduce it?)

Paths come from images/paths.py; pins from images/pins/; binaries from images/binaries/. The committed
renders and the engine-facts files are written by images/generate/ (golden.py, facts.py).
"""
