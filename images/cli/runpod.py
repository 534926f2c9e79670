"""`template`: a target's RunPod template, printed or upserted by name. Thin wiring only: what
the template holds is images/runpod/template.py, how it reaches RunPod is images/runpod/api.py."""

from __future__ import annotations

import argparse
import os
import sys

from supervisor.errors import KilnError

from . import command as opt
from .command import Command


def _template_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    opt.image(p)
    opt.template_reference_options(p, name_flag="--name")
    p.add_argument("--upsert", action="store_true", help="create or update the template by name through RunPod's "
                   "REST API v2 ($RUNPOD_API_KEY) instead of printing it; prints the template id")
    p.add_argument("--api", metavar="URL", help="with --upsert: REST API v2 base URL (default: $RUNPOD_API_URL or "
                   "https://api.runpod.io/v2)")
    opt.allow_floating(p, "with --upsert: send a template")


def _template(args: argparse.Namespace) -> int:
    """Print the template (a v2 CreateTemplateRequest, JSON), or with --upsert create or update it by name."""
    from ..pins.lock import missing
    from ..build.render import FloatingRefused
    from ..runpod.api import RunPodAPI
    from ..runpod.template import build_template, upsert

    only_upsert = [o for o, given in (("--api", args.api), ("--allow-floating", args.allow_floating)) if given]
    if only_upsert and not args.upsert:
        raise KilnError(f"{' and '.join(only_upsert)} cannot be combined with printing the template (nothing is "
                        "sent; a floating template prints anyway): add --upsert or drop it")
    target, pins = opt.target_and_pins(args.target)
    tpl = build_template(target, pins, repository=args.image, image=args.image_ref, name=args.template_name,
                         registry=args.registry_auth)
    if tpl.floating and not args.image_ref:
        print(f"note: FLOATING: {', '.join(tpl.floating)} unresolved; image is the tag "
              f"`build.py build --target {target.name} --allow-floating` gives ({tpl.body['image']}), "
              "an image labelled io.kiln.floating=true", file=sys.stderr)
    if not args.upsert:
        sys.stdout.write(tpl.to_json())
        return 0
    if tpl.floating and not args.allow_floating:
        raise FloatingRefused(target, [f for f in missing(target, pins)])
    key = os.environ.get("RUNPOD_API_KEY", "")
    if not key:
        raise KilnError("template --upsert needs RUNPOD_API_KEY (RunPod console: Settings > API Keys); "
                        "`build.py template` alone prints the template without it")
    result = upsert(RunPodAPI(key, args.api), tpl.body)
    print(f"template {result.name}: {result.action} (id {result.template_id}); `python build.py pods up "
          f"--target {target.name}` deploys pods from it", file=sys.stderr)
    print(result.template_id)
    return 0


COMMANDS = (
    Command("template", "print a target's RunPod template, or create or update it by name (--upsert)",
            _template, _template_arguments,
            description="Print the target's RunPod template (a CreateTemplateRequest of RunPod's REST API v2, "
            "checked against images/schemas/runpod-rest-v2.json before it is printed or sent), or with --upsert create or update it by "
            "name and print its id.\ndocs/pods.md: The template."),
)
