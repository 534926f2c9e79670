"""A decode estimate, not a bound: what one stream and N streams get from a GPU kind, calibrated on
measured rows (images/plan/decode-calibration.json, written by `python bench/plan_decode.py --write`
from the sweeps under images/plan/decode-sweeps/ and the field notes' rows).

A decode step of N streams pays fixed costs (kernel launches, synchronisation, sampling) per step and
per layer, and reads the weights the step touches and every stream's KV cache:

    t_step(N) = fixed_s[N] + per_layer_s[N] x layers + (touched(N) + N x kv_per_token x position) / (efficiency[N] x bandwidth)

- The three coefficients are fitted per stream count on measured steps of many shapes (least squares
  over the rows of one engine and slot layout); between two measured counts they are interpolated,
  past the last one extrapolated along its last slope (the basis says so).
- bandwidth: the GPU kind's datasheet figure (images/gpus.toml, with whether it was read on the
  vendor's page). A layer split over several cards (llama.cpp) reads one card at a time, so one card's
  bandwidth counts; vLLM's tensor parallelism reads every card at once. The fixed costs are the
  calibration GPU's: another GPU kind gets them unchanged (an assumption, said in the basis).
- touched(N): the shared weights, and of a MoE's routed experts those N tokens use between them (each
  token `used` of `total`, spread uniformly: total x (1 - (1 - used/total)^N); real routers are skewed,
  so this leans slow). llama.cpp keeps the input embedding on the host: a GPU step does not read it.
- aggregate(N) = N / t_step(N); one stream = 1 / t_step(1). `position` is where in the context the
  step is: POSITION for the figures plan ranks by (a short conversation), the planned context for the
  figure beside it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.plan.shape import Shape

DATA = Path(__file__).with_name("decode-calibration.json")
POSITION = 128            # a short conversation: the calibration sweeps decoded 128 tokens after a few


@dataclass(frozen=True)
class Coefficients:
    fixed_s: float
    per_layer_s: float
    efficiency: float       # the share of the datasheet bandwidth a step's reads get


@dataclass(frozen=True)
class Fit:
    """One engine's (and slot layout's) calibration: coefficients per measured stream count."""
    engine: str
    layout: str                          # llama.cpp: "unified" or "split" (-np without --kv-unified); vLLM: ""
    by_streams: dict[int, Coefficients]
    basis: str                           # what it was calibrated on, for the plan's label
    checked: str = ""                    # how well it predicts what it was not fitted on

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Fit":
        return Fit(engine=d["engine"], layout=d.get("layout", ""), basis=d["basis"], checked=d.get("checked", ""),
                   by_streams={int(n): Coefficients(**c) for n, c in d["by_streams"].items()})

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "layout": self.layout, "basis": self.basis, "checked": self.checked,
                "by_streams": {str(n): c.__dict__ for n, c in sorted(self.by_streams.items())}}

    def at(self, streams: int) -> tuple[Coefficients, bool]:
        """The coefficients at `streams`, and whether they were extrapolated past the last measured count."""
        points = sorted(self.by_streams.items())
        if streams <= points[0][0]:
            return points[0][1], False
        for (n0, c0), (n1, c1) in zip(points, points[1:]):
            if n0 <= streams <= n1:
                return _lerp(c0, c1, (streams - n0) / (n1 - n0)), False
        if len(points) == 1:
            return points[-1][1], True
        (n0, c0), (n1, c1) = points[-2], points[-1]
        return _lerp(c0, c1, (streams - n0) / (n1 - n0)), True


def _lerp(a: Coefficients, b: Coefficients, f: float) -> Coefficients:
    return Coefficients(fixed_s=max(0.0, a.fixed_s + (b.fixed_s - a.fixed_s) * f),
                        per_layer_s=max(0.0, a.per_layer_s + (b.per_layer_s - a.per_layer_s) * f),
                        efficiency=max(0.05, a.efficiency + (b.efficiency - a.efficiency) * f))


def touched_bytes(shape: Shape, streams: int, engine: str) -> float:
    """The weights one step of N tokens reads from the GPU."""
    total, used = shape.experts
    routed = shape.weights_by_kind.get("routed_experts", 0)
    out = float(shape.weights_bytes)
    if total and routed:
        out -= routed * (1 - used / total) ** streams
    if engine == "llamacpp":
        out -= shape.host_input_bytes
    return max(out, 1.0)


@dataclass(frozen=True)
class Estimate:
    decode_1: float
    decode_n: float
    streams: int
    extrapolated: bool


def step_s(fit: Fit, shape: Shape, *, bandwidth_gbs: float, cards_read_at_once: int, streams: int,
           kv_bytes_per_token: float, position: int = POSITION) -> tuple[float, bool]:
    c, extrapolated = fit.at(streams)
    bw = c.efficiency * bandwidth_gbs * 1e9 * cards_read_at_once
    reads = touched_bytes(shape, streams, fit.engine) + streams * kv_bytes_per_token * position
    return c.fixed_s + c.per_layer_s * shape.n_layers + reads / bw, extrapolated


def estimate(fit: Fit, shape: Shape, *, bandwidth_gbs: float, cards_read_at_once: int, streams: int,
             kv_bytes_per_token: float, position: int = POSITION) -> Estimate:
    kw = {"bandwidth_gbs": bandwidth_gbs, "cards_read_at_once": cards_read_at_once,
          "kv_bytes_per_token": kv_bytes_per_token, "position": position}
    one, _ = step_s(fit, shape, streams=1, **kw)
    many, extrapolated = step_s(fit, shape, streams=streams, **kw)
    return Estimate(1 / one, streams / many, streams, extrapolated)


@functools.cache
def fits(path: Path = DATA) -> dict[tuple[str, str], Fit]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {(d["engine"], d.get("layout", "")): Fit.from_json(d) for d in data["fits"]}


def fit_for(engine: str, layout: str = "") -> Fit | None:
    return fits().get((engine, layout))
