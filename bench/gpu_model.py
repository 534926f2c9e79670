#!/usr/bin/env python3
"""A real small model vLLM can serve, made from a GGUF that can travel (issue 14, item 1).

    python3 bench/gpu_model.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR [--dtype bfloat16]

transformers' GGUF loader (`from_pretrained(..., gguf_file=...)`, which needs the `gguf` package)
dequantizes the weights and rebuilds the tokenizer from the GGUF's own vocabulary and chat
template; the result is written as a safetensors directory (config.json, model.safetensors,
tokenizer files). It prints, and writes to DIR/kiln-model.json, the sha256 of the GGUF it read and
of every file it wrote, so the device run checks what it serves against what was made here.
llama-server serves the original GGUF; writing these weights back as a bf16 GGUF with llama.cpp's
convert_hf_to_gguf.py was tried on the CPU machine (2026-12-01) and the result fails every request
in llama-server with "unordered_map::at" (the GGUF-derived tokenizer.json does not convert back),
so the comparison serves the same weights as Q4_1 (llama.cpp) and as their bf16 dequantization (vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the checkout, for images.digest
from images.digest import sha256_file  # noqa: E402


def save_plain(model, out: Path) -> None:
    """The dequantized weights as a plain safetensors checkpoint.

    transformers 5 marks a GGUF-loaded model as quantized (QuantizationMethod.GGUF) and refuses
    save_pretrained, though its tensors are already plain; so write them directly, with the config
    minus its quantization_config (vLLM would otherwise look for a GGUF quantizer)."""
    from safetensors.torch import save_file

    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    if not cfg.architectures:
        # a GGUF-loaded config names none; vLLM and convert_hf_to_gguf.py pick the model class by it
        cfg.architectures = [type(model).__name__]
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)          # shared with embed_tokens; safetensors refuses aliases
    cfg.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--gguf-sha256", help="refuse a GGUF whose sha256 differs")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = ap.parse_args()
    got = sha256_file(args.gguf)
    if args.gguf_sha256 and got != args.gguf_sha256:
        print(f"gpu_model: {args.gguf} has sha256 {got}, expected {args.gguf_sha256}", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    d, name = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=getattr(torch, args.dtype))
    args.out.mkdir(parents=True, exist_ok=True)
    save_plain(model, args.out)
    tok.save_pretrained(args.out)
    # a quick greedy check that the weights are the model's, not noise: it must answer in words
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                  return_tensors="pt")
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True)
    record = {"gguf": name, "gguf_sha256": got, "dtype": args.dtype, "seconds": round(time.monotonic() - t0, 2),
              "architecture": model.config.architectures, "parameters": sum(p.numel() for p in model.parameters()),
              "greedy_reply_2plus2": reply,
              "files": {p.name: sha256_file(p) for p in sorted(args.out.iterdir()) if p.is_file()}}
    (args.out / "kiln-model.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
