"""Where the workstation side's files are: every path images/ reads or writes, in one leaf module.

It imports nothing of Kiln, so any module can find a file without importing the module that
uses it (that is how the old import cycle binaries -> render -> engine_facts -> golden ->
template -> render came about). Paths are those of this checkout (or of an editable install).
"""

from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent
REPO_ROOT = IMAGES_DIR.parent

# -- data: what a build reads ---------------------------------------------------------------------
TARGETS_DIR = IMAGES_DIR / "targets"              # one <target>.toml per image
DEPLOY_DIR = IMAGES_DIR / "deploy"                # the deploy configs targets name ([deploy] config)
TEMPLATES_DIR = IMAGES_DIR / "templates"          # the Dockerfile templates (jinja2)
LOCK_PATH = IMAGES_DIR / "lock.toml"              # the resolved pins of every target
CLOSURES_DIR = IMAGES_DIR / "closures"            # <package>-<version>-cp312.txt: a wheel engine's hash-locked closure
SCHEMAS_DIR = IMAGES_DIR / "schemas"
RUNPOD_SCHEMA = SCHEMAS_DIR / "runpod-rest-v2.json"   # the vendored excerpt of RunPod's REST v2 document
SPDX_SCHEMA = SCHEMAS_DIR / "spdx-2.3.schema.json"    # the SPDX 2.3 JSON schema, verbatim (an SBOM is checked against it)
SPDX_SCHEMA_SOURCE = SCHEMAS_DIR / "spdx-2.3.schema.source.json"   # where it came from: URL, commit, sha256

# -- scripts a build copies into its context --------------------------------------------------------
SCRIPTS_DIR = IMAGES_DIR / "scripts"
COMPILE_SCRIPT = SCRIPTS_DIR / "compile-llama-server.sh"
VLLM_SNAPSHOT_SCRIPT = SCRIPTS_DIR / "vllm-flag-snapshot.py"
CUDA_FLOOR_SCRIPT = IMAGES_DIR / "pins" / "cudafloor.py"    # runs in the build as kiln/cuda-floor.py
SUPERVISOR_DIR = REPO_ROOT / "supervisor"                  # copied whole into every image
SUPERVISOR_REQUIREMENTS = SUPERVISOR_DIR / "requirements.txt"
ROUTER_REQUIREMENTS = SUPERVISOR_DIR / "router-requirements.txt"   # the router image's smg, hashed

# -- committed generated files (`python build.py generate` writes them, `--check` verifies them) -----
RENDERED_DIR = IMAGES_DIR / "rendered"            # <target>/Dockerfile and <target>/runpod-template.json
ENGINE_FACTS_DIR = IMAGES_DIR / "engine-facts"    # <package>-<version>.json per pinned llama.cpp sdist
DOCS_CLI = REPO_ROOT / "docs" / "cli.md"          # build.py's reference, from the parsers' --help
DOCS_ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"   # its module map is generated (images/generate/module_map.py)
