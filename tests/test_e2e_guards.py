"""Bad input never kills the server (issue 13, part 1).

A request with an out-of-vocabulary token id used to crash the scheduler (an IndexError
in the embedding), and SGLang then stopped every process, with ``--kv-policy vase`` and
with ``none``. Now such input, an empty prompt, and a prompt plus ``max_new_tokens``
beyond the context all get HTTP 400 naming the field. A hypothesis fuzz then sends
thousands of request bodies with random JSON types and values in every field we read
(``custom_params`` included) to ``/generate``, ``/v1/completions`` and
``/v1/chat/completions``: every answer is 200 or 4xx, the server stays up, and afterwards
it answers a normal request with the same tokens as before, with 0 KV slots in use.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import requests
from e2e_helpers import PROMPT, tokens, wait_idle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vase_sglang.patches.guards import check_logprob_start, check_prompt_ids, check_top_logprobs

pytestmark = pytest.mark.e2e

CONTEXT = 160  # bounds each generation; rounds still run (region 32 + 8)
VOCAB = 600  # above the tiny test model's vocabulary (about 500 BPE tokens): fuzzed ids hit both sides
FUZZ_ARGS = ("--kv-policy", "vase", "--kv-budget", "32", "--kv-recent", "8", "--kv-seed", "3",
             "--context-length", str(CONTEXT))
EXAMPLES = {"generate": 1500, "completions": 600, "chat": 600}
STATUS: Counter[int] = Counter()  # every answer of the fuzz, for the report


@pytest.fixture(scope="module")
def guard_server(request, tiny_model, server_dir):
    from conftest import _server

    return _server(request, "guards", tiny_model, server_dir, *FUZZ_ARGS)


@pytest.fixture(scope="module")
def vocab(tiny_model) -> int:
    return json.loads((tiny_model / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def baseline(guard_server) -> list[int]:
    return tokens(_normal(guard_server))


def _normal(server) -> dict:
    r = requests.post(server.url + "/generate", timeout=120, json={
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 100, "temperature": 0, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()


def test_logprob_start_check_allows_the_default_and_positions_only() -> None:
    for ok in (None, -1, 0, 7):
        check_logprob_start(ok)
    for bad in (-2, -3, 1.5, True, "0"):
        with pytest.raises(ValueError, match="logprob_start_len"):
            check_logprob_start(bad)


def test_top_logprobs_check_allows_up_to_the_vocabulary() -> None:
    for ok in (None, 0, 5, 316):
        check_top_logprobs(ok, 316)
    for bad in (317, 10**9, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="top_logprobs_num"):
            check_top_logprobs(bad, 316)


def test_prompt_id_check_names_the_field() -> None:
    check_prompt_ids([0, 5, 315], 316)
    for bad, match in (([], "empty"), ([316], r"input_ids\[0\] = 316"), ([3, -1], r"input_ids\[1\] = -1"),
                       ([1.5], "1.5"), ([True], "True"), (["7"], "'7'")):
        with pytest.raises(ValueError, match=match):
            check_prompt_ids(bad, 316)


OOV = -1000  # replaced by the model's vocabulary size


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/generate", {"input_ids": [OOV]}, "input_ids[0]"),
    ("/generate", {"input_ids": [5, 60000, 7]}, "input_ids[1]"),
    ("/generate", {"input_ids": [-1]}, "input_ids[0]"),
    ("/generate", {"input_ids": []}, "input_ids cannot be empty"),  # SGLang's own check
    ("/generate", {"text": ""}, "text: the prompt is empty"),
    # Killed the server (an assertion in SGLang's input log-prob bookkeeping), found by the fuzz.
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -3}, "logprob_start_len = -3"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": CONTEXT}}, "context length"),
    ("/v1/completions", {"model": "m", "prompt": [OOV], "max_tokens": 4}, "input_ids[0]"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10 * CONTEXT}, "context length"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 10 * CONTEXT}, "max_completion_tokens is too large"),  # SGLang's
    # Each killed the whole server (a top-k over the vocabulary in the scheduler): issue 21.
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 10**9},
     "top_logprobs_num = 1000000000"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4, "logprobs": 10**6},
     "top_logprobs_num = 1000000"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "logprobs": True, "top_logprobs": 10**6}, "top_logprobs_num = 1000000"),
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "token_ids_logprob": [OOV]},
     "token_ids_logprob[0]"),
    # Each was an HTTP 500 (a per-prompt field of the wrong shape failed after normalisation): issue 21.
    ("/generate", {"text": "hi", "rid": ["x", "y"]}, "rid: one prompt takes one string id"),
    ("/generate", {"text": ["a", "b", "c"], "sampling_params": [{"max_new_tokens": 2}]},
     "sampling_params: 1 objects for 3 prompts"),
])
def test_bad_input_is_a_400_naming_the_field(guard_server, baseline, vocab, path: str, body: dict,
                                             field: str) -> None:
    body = json.loads(json.dumps(body).replace(str(OOV), str(vocab)))
    r = requests.post(guard_server.url + path, json=body, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:500])
    assert field in r.text, r.text[:500]
    assert guard_server.alive()


# ---- the fuzz ------------------------------------------------------------------------
json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
             | st.text(max_size=12))
json_any = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                             max_size=4),
                        max_leaves=8)


def either(plausible: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(plausible, json_any)


small_count = either(st.integers(-3, 6) | st.integers(10**4, 10**12))
probability = either(st.floats(-0.5, 1.5, allow_nan=False))
token_ids = either(st.lists(st.integers(-3, VOCAB + 3), max_size=10))
kv_fields = st.fixed_dictionaries({}, optional={
    "kv_policy": either(st.sampled_from(["vase", "none", "snapkv", "rkv", "curdkv", "vase-dkv", "streamingllm",
                                         "random", "bogus"])),
    "kv_budget": either(st.sampled_from([0, 8, 16, 24, 32, 40, 64, -8])),
    "kv_n_large": either(st.integers(-2, 40)),
    "kv_seed": either(st.integers(-2, 2**64)),
    "kv_recent": either(st.integers(-1, 16)),
    "kv_budjet": json_any,
    "__vase_validated__": json_any,
})
sampling = st.fixed_dictionaries({}, optional={
    "max_new_tokens": small_count, "temperature": either(st.floats(-1, 3, allow_nan=False)),
    "top_p": probability, "top_k": either(st.integers(-2, 50)), "min_p": probability,
    "frequency_penalty": either(st.floats(-3, 3, allow_nan=False)),
    "presence_penalty": either(st.floats(-3, 3, allow_nan=False)),
    "repetition_penalty": either(st.floats(-1, 3, allow_nan=False)),
    "stop": either(st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3)),
    "stop_token_ids": token_ids, "ignore_eos": either(st.booleans()), "n": either(st.integers(-1, 3)),
    "skip_special_tokens": either(st.booleans()), "custom_params": either(kv_fields),
    "sampling_seed": either(st.integers(-2, 2**64)),
})
native_body = st.fixed_dictionaries({}, optional={
    "text": either(st.text(max_size=30)), "input_ids": token_ids, "sampling_params": either(sampling),
    "return_logprob": either(st.booleans()), "top_logprobs_num": either(st.integers(-1, 5)),
    "logprob_start_len": either(st.integers(-3, 20)), "stream": st.booleans(),
})
openai_common = {
    "model": either(st.just("m")), "max_tokens": small_count, "temperature": either(st.floats(-1, 3, allow_nan=False)),
    "top_p": probability, "n": either(st.integers(-1, 3)), "stop": either(st.text(max_size=4)),
    "seed": either(st.integers(-2, 2**64)), "stream": st.booleans(), "custom_params": either(kv_fields),
    "frequency_penalty": either(st.floats(-3, 3, allow_nan=False)),
}
completions_body = st.fixed_dictionaries({"prompt": either(st.text(max_size=20) | token_ids)}, optional={
    **openai_common, "logprobs": either(st.integers(-1, 6)), "echo": either(st.booleans())})
message = st.fixed_dictionaries({"role": either(st.sampled_from(["user", "system", "assistant", "tool", "x"])),
                                 "content": either(st.text(max_size=20))})
chat_body = st.fixed_dictionaries({"messages": either(st.lists(message, max_size=3))}, optional={
    **openai_common, "logprobs": either(st.booleans()), "top_logprobs": either(st.integers(-1, 6))})


def _post(server, path: str, body: dict) -> int:
    stream = body.get("stream") is True
    r = requests.post(server.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=120, stream=stream)
    status = r.status_code
    if stream and status == 200:
        for line in r.iter_lines():  # errors inside a stream arrive as data lines
            if line.startswith(b"data: {") and b'"error"' in line:
                code = json.loads(line[6:]).get("error", {}).get("code", 500)
                status = code if isinstance(code, int) else 500
    r.close()
    STATUS[status] += 1
    return status


def _fuzz(server, path: str, strategy: st.SearchStrategy, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=strategy)
    def run(body: dict) -> None:
        status = _post(server, path, body)
        assert status < 500, f"{path} answered {status} to {json.dumps(body)[:400]}"
        assert server.alive(), f"the server died on {path} {json.dumps(body)[:400]}"

    run()


@pytest.mark.parametrize(("path", "strategy"), [("/generate", native_body), ("/v1/completions", completions_body),
                                                ("/v1/chat/completions", chat_body)],
                         ids=["generate", "completions", "chat"])
def test_fuzzed_bodies_never_get_a_5xx(guard_server, baseline, path: str, strategy: st.SearchStrategy) -> None:
    key = {"/generate": "generate", "/v1/completions": "completions", "/v1/chat/completions": "chat"}[path]
    _fuzz(guard_server, path, strategy, EXAMPLES[key])


def test_after_the_fuzz_the_server_answers_as_before(guard_server, baseline) -> None:
    assert guard_server.alive()
    assert tokens(_normal(guard_server)) == baseline
    assert wait_idle(guard_server) == 0
    assert "Scheduler hit an exception" not in guard_server.log_text()
    print(f"fuzz answers by status: {dict(sorted(STATUS.items()))}")
