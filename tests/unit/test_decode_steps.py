"""How many tokens a streamed reply decoded between its first and last content chunk. llama.cpp
streams one token a chunk; a speculating vLLM streams each engine step's accepted tokens as one
chunk (on the H200, 2026-12-01, n-gram on prose: 768 tokens, 117 drafts, 372 accepted, so ~396
chunks). Counting chunks halved the selftest's and the benches' decode rate there."""

from __future__ import annotations

from supervisor.selftest.client import Reply
from supervisor.selftest.measure import DecodeResult, DecodeSample


def reply(chunks: int, tokens: int | None, finish: str = "length", step_s: float = 0.01) -> Reply:
    r = Reply(status=200, finish_reason=finish, usage=None if tokens is None else {"completion_tokens": tokens})
    r.chunk_times = [1.0 + i * step_s for i in range(chunks)]
    return r


def test_one_token_a_chunk_counts_chunks():
    assert reply(128, 128).decode_steps == 127
    assert reply(128, None).decode_steps == 127               # no usage: chunks are all there is
    assert reply(128, 129, finish="stop").decode_steps == 127  # the EOS token streams no content


def test_several_tokens_a_chunk_count_the_usage():
    r = reply(396, 768)                                      # the H200's n-gram prose run, in shape
    assert r.decode_steps == 767
    assert reply(396, 768, finish="stop").decode_steps == 766
    assert r.decode_span_s == 395 * 0.01


def test_nothing_to_time():
    assert reply(1, 5).decode_steps == 0 and reply(1, 5).decode_span_s == 0.0
    assert reply(0, None).decode_steps == 0


def sample(r: Reply) -> DecodeSample:
    return DecodeSample(prompt="p", chunks=len(r.chunk_times), steps=r.decode_steps,
                        completion_tokens=r.completion_tokens, finish_reason=r.finish_reason,
                        client_s=r.decode_span_s, engine_steps=None, engine_s=None, metrics=None, verdict=None)


def test_the_selftest_rate_and_token_count_follow_the_tokens():
    spec = sample(reply(100, 300, step_s=0.01))               # 299 tokens in 0.99 s, three a chunk
    plain = sample(reply(100, 100, step_s=0.01))
    assert round(spec.client_tok_s, 1) == round(299 / 0.99, 1)
    assert round(plain.client_tok_s, 1) == round(99 / 0.99, 1)
    res = DecodeResult(target_tokens=350, samples=[spec, plain])
    assert res.tokens == 400 and res.enough
    assert round(res.client_tok_s, 1) == round((299 + 99) / 1.98, 1)
