"""Building an image: target + lock -> Dockerfile and context -> an image with an immutable tag.

    render.py          RenderContext (one typed object) -> Jinja (StrictUndefined; `dq` for ENV/LABEL,
                       `shq` for RUN lines) -> Dockerfile + build context
    outdir.py          `render --out DIR`: only Kiln's own files, resumable, never deleting a file
    golden.py          images/rendered/<target>/: the committed renders (`python build.py generate`)
    engine_facts.py    what a pinned llama.cpp knows about GGUF files, and where a target's facts are
    facts_generator.py reads the pinned llama.cpp tree, writes images/engine-facts/ (generate)
    docker.py          the Docker engine: is one there, BuildKit builds with secrets, push
    tags.py            immutable release tags and CI's staging tags

Paths come from images/paths.py; pins from images/pins/; binaries from images/binaries/.
"""
