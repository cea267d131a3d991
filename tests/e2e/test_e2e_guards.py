"""Bad input never kills the server.

Without the guards a request with an out-of-vocabulary token id crashes the scheduler (an
IndexError in the embedding), and SGLang then stops every process, with ``--kv-policy vase``
and with ``none``; so does a huge ``top_logprobs_num`` or a list ``lora_id`` for one prompt.
Such input gets HTTP 400 naming the field. A hypothesis fuzz derived from SGLang's own
request types (``fuzz_fields``: every field of ``GenerateReqInput`` and of the pydantic
model of every other client route) then sends thousands of bodies, to a ``vase`` and to a
``none`` server: every answer is 200 or 4xx, the server stays up, and afterwards it
answers a normal request with the same tokens as before, with 0 KV slots in use.

``VASE_FUZZ_SCALE`` multiplies the number of bodies (``scripts/reliability.sh --long``
uses 10); with ``VASE_RESULTS`` set the counts go to ``reliability/fuzz-<policy>.json``.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support import fuzz_fields
from support.constants import PROMPT
from support.e2e import record, tokens, wait_idle
from support.server import ServerConfig, shared_server

from vase_sglang.patches.guards.bodies import check_logprob_start, check_prompt_ids, check_top_logprobs

CONTEXT = 160  # bounds each generation; rounds still run (region 32 + 8)
FUZZ_ARGS = ("--kv-policy", "vase", "--kv-budget", "32", "--kv-recent", "8", "--kv-seed", "3",
             "--context-length", str(CONTEXT))


@shared_server
def guard_server(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("guards", FUZZ_ARGS)


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
    # Without the guard this kills the server (an assertion in SGLang's input log-prob bookkeeping).
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -3}, "logprob_start_len = -3"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": CONTEXT}}, "context length"),
    ("/v1/completions", {"model": "m", "prompt": [OOV], "max_tokens": 4}, "input_ids[0]"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10 * CONTEXT}, "context length"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 10 * CONTEXT}, "max_completion_tokens is too large"),  # SGLang's
    # Without the guard each kills the whole server (a top-k over the vocabulary in the scheduler).
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 10**9},
     "top_logprobs_num = 1000000000"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4, "logprobs": 10**6},
     "top_logprobs_num = 1000000"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "logprobs": True, "top_logprobs": 10**6}, "top_logprobs_num = 1000000"),
    ("/generate", {"input_ids": [5, 6, 7], "return_logprob": True, "token_ids_logprob": [OOV]},
     "token_ids_logprob[0]"),
    # Without the guard each is an HTTP 500 (a per-prompt field of the wrong shape fails after normalisation).
    ("/generate", {"text": "hi", "rid": ["x", "y"]}, "rid: one prompt takes one string id"),
    # Without the guard these are HTTP 500s (the handler passes parameters to GenerateReqInput).
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"max_new_tokens": 2}},
     "parameters.max_new_tokens: not a generation parameter"),
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"image_data": None}},
     "parameters.image_data: the inputs come from the instances"),
    # SGLang's own body validation names rid in these (loc ('body', 'rid', ...)).
    ("/generate", {"text": ["a", "b"], "rid": 5}, "'rid'"),
    ("/generate", {"text": ["a", "b"], "rid": ["x", 3]}, "'rid'"),
    ("/generate", {"text": "hi", "sampling_params": [{"n": 2, "max_new_tokens": 2}]},
     "sampling_params: a list for one prompt"),
    ("/generate", {"text": ["a", "b", "c"], "sampling_params": [{"max_new_tokens": 2}]},
     "sampling_params: 1 objects for 3 prompts"),
    # Without the guard each kills the whole server (the scheduler reads a per-prompt field as a list).
    ("/generate", {"text": "hi", "lora_id": ["a"]}, "lora_id: a list for one prompt"),
    ("/generate", {"text": "hi", "return_hidden_states": [False]}, "return_hidden_states: a list for one prompt"),
    # Without the guard this is an HTTP 500 (SGLang splits a batch with obj[i]).
    ("/generate", {"input_ids": [[5, 6], [7]], "audio_data": []}, "audio_data: fewer values than the 2 prompts"),
    # The prompt-id guard itself gets one id per prompt here and must answer 400, not an HTTP 500.
    ("/generate", {"input_ids": [5, 6, 7], "text": ["a"]}, "input_ids: expected a list of token ids"),
    # Without the guard these are HTTP 500s (re.error while SGLang tokenizes the request).
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4, "stop_regex": "a[b"},
     "sampling_params.stop_regex: not a regular expression"),
    ("/generate", {"text": "hi", "sampling_params": {"stop_regex": ["ok", "(x"]}},
     "sampling_params.stop_regex[1]: not a regular expression"),
    # Without the guard this kills the server (an int32 overflow packing the batch's top_k).
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4, "top_k": 10**12},
     "sampling_params.top_k = 1000000000000: out of range"),
    # Without the guard this is an HTTP 500 (SGLang's pydantic "before" validator calls .get() on the list).
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "response_format": [{}]}, "malformed request body: AttributeError"),
    # Without the guard this is an HTTP 500 (SessionParams(**value) with an unknown key).
    ("/generate", {"text": "hi", "session_params": {"bogus": 1}}, "session_params:"),
    # Without the guard this kills the server (2**31 copies of the request exhaust memory).
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "n": 2**31}, "sampling_params.n = 2147483648: at most 1024"),
    # Without the guard this kills the server (the scheduler calls .reconstruct() on the float).
    ("/generate", {"input_ids": [[5, 6], [7]], "positional_embed_overrides": [None, 7e16]},
     "positional_embed_overrides: only the Python Engine API"),
    # Without the guard this kills the server (an empty list is read as one prompt's overrides).
    ("/generate", {"text": "hi", "positional_embed_overrides": []}, "positional_embed_overrides: only the Python"),
    # Without the guards the other client routes answer HTTP 500s: the embedding body's
    # per-prompt shapes, token ids the tokenizer cannot decode, unknown parser names, and
    # Ollama options SGLang refuses (a 500, or a stream cut short after its 200).
    ("/encode", {"text": "hi", "sampling_params": [{}]}, "sampling_params: a list for one prompt"),
    ("/classify", {"text": "hi", "rid": ["x", "y"]}, "rid: one prompt takes one string id"),
    ("/v1/embeddings", {"model": "m", "input": ["a", "b"], "rid": ["x"]}, "rid: 1 ids for 2 prompts"),
    ("/v1/classify", {"model": "m", "input": "a", "rid": ["x", "y"]}, "rid: one prompt takes one string id"),
    ("/detokenize", {"model": "m", "tokens": [5, OOV]}, "tokens[1] = "),
    ("/v1/detokenize", {"model": "m", "tokens": [[5], [-1]]}, "tokens[1][0] = -1"),
    ("/parse_function_call", {"text": "x", "tool_call_parser": "bogus"}, "Unsupported tool_call_parser: bogus"),
    ("/separate_reasoning", {"text": "x", "reasoning_parser": "bogus"}, "Unsupported model type: bogus"),
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "options": {"temperature": "hot"}}, "sampling_params.temperature"),
    ("/api/generate", {"model": "m", "prompt": "hi", "stream": False, "options": {"top_k": 10**12}},
     "sampling_params.top_k = 1000000000000: out of range"),
])
@pytest.mark.server
def test_bad_input_is_a_400_naming_the_field(guard_server, baseline, vocab, path: str, body: dict,
                                             field: str) -> None:
    body = json.loads(json.dumps(body).replace(str(OOV), str(vocab)))
    r = requests.post(guard_server.url + path, json=body, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:500])
    assert field in r.text, r.text[:500]
    assert guard_server.alive()



TWO_TOKENS = {"max_new_tokens": 2, "n": 2}


@pytest.mark.parametrize(("path", "body", "answers"), [
    # Parallel sampling fills rid with one id per sample (prompts x n) before the guards
    # run; a guard that read the filled rid refused these (the soak's chat with n=2).
    ("/generate", {"text": "hi", "sampling_params": TWO_TOKENS}, 2),
    ("/generate", {"text": "hi", "rid": "mine", "sampling_params": TWO_TOKENS}, 2),
    ("/generate", {"text": ["a", "b"], "rid": ["r1", "r2"], "sampling_params": TWO_TOKENS}, 4),
    ("/generate", {"input_ids": [[5, 6], [7]], "sampling_params": [TWO_TOKENS, TWO_TOKENS]}, 4),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "n": 2}, 2),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2, "n": 2}, 2),
])
@pytest.mark.server
def test_parallel_sampling_and_batch_forms_are_served(guard_server, path: str, body: dict, answers: int) -> None:
    r = requests.post(guard_server.url + path, json=body, timeout=120)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    got = r.json()
    assert len(got["choices"] if path.startswith("/v1/") else got) == answers, r.text[:500]

# ---- the fuzz ------------------------------------------------------------------------
SCALE = float(os.environ.get("VASE_FUZZ_SCALE", "1"))
MAIN_EXAMPLES = {"/generate": 800, "/v1/completions": 400, "/v1/chat/completions": 400}
OTHER_EXAMPLES = 25  # each other client route (24 in SGLang 0.5.23)
NONE_ARGS = ("--kv-policy", "none", "--context-length", str(CONTEXT))
# Per policy and route: answers by status, and the first body after which the server died.
REPORT: dict[str, dict[str, Any]] = defaultdict(lambda: {"status": defaultdict(Counter), "fatal": None})


@shared_server
def guards_none_server(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("guards-none", NONE_ARGS)


@pytest.fixture(scope="module", params=["guard_server", "guards_none_server"], ids=["vase", "none"])
def fuzz_server(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def fuzz_baseline(fuzz_server) -> list[int]:
    return tokens(_normal(fuzz_server))


def _policy(server) -> str:
    return "vase" if server.name == "guards" else "none"


def _stream_error_status(error: dict) -> int:
    """The HTTP status an error inside a stream stands for: OpenAI streams carry it as
    ``code``; Anthropic's (``/v1/messages``) carry only a ``type``, mapped by SGLang's own
    table (``invalid_request_error`` is its 400). Anything else counts as a 500."""
    from sglang.srt.entrypoints.anthropic.serving import ERROR_TYPE_MAP

    code = error.get("code")
    if isinstance(code, int):
        return code
    by_type = {kind: status for status, kind in sorted(ERROR_TYPE_MAP.items(), reverse=True)}  # lowest wins
    return by_type.get(error.get("type"), 500)


def _post(server, path: str, body: dict) -> int:
    stream = body.get("stream") is True
    r = requests.post(server.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=120, stream=stream)
    status = r.status_code
    if stream and status == 200:
        for line in r.iter_lines():  # errors inside a stream arrive as data lines
            if line.startswith(b"data: {") and b'"error"' in line:
                status = _stream_error_status(json.loads(line[6:]).get("error", {}))
    r.close()
    return status


def _fuzz(server, path: str, strategy: st.SearchStrategy, examples: int) -> None:
    report = REPORT[_policy(server)]

    # No shrinking: once the server is dead every body fails, and the first one is the finding.
    @settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(body=strategy)
    def run(body: dict) -> None:
        try:
            status = _post(server, path, body)
        except requests.RequestException:
            status = 0  # no answer, or one cut short
        report["status"][path][status] += 1
        text = json.dumps(body)[:600]
        if not server.alive() and report["fatal"] is None:
            report["fatal"] = {"path": path, "body": text}
        assert server.alive(), f"the server died on {path} {text}"
        assert 0 < status < 500, f"{path} answered {status or 'nothing'} to {text}"

    run()


def test_every_client_route_is_fuzzed_or_named_an_operator_route() -> None:
    """A POST route added upstream fails here until it is placed: fuzzed, or an operator's."""
    routes = fuzz_fields.post_routes()
    assert set(fuzz_fields.MAIN) <= set(routes)
    assert fuzz_fields.OPERATOR <= set(routes), sorted(fuzz_fields.OPERATOR - set(routes))
    assert len(fuzz_fields.serving_routes()) >= 20
    assert len(fuzz_fields.generate_fields()) >= 60  # GenerateReqInput's fields, not a hand-picked few


@pytest.mark.server
@pytest.mark.parametrize("path", fuzz_fields.MAIN)
def test_fuzzed_bodies_never_get_a_5xx(fuzz_server, fuzz_baseline, path: str) -> None:
    routes = fuzz_fields.serving_routes()
    _fuzz(fuzz_server, path, fuzz_fields.route_bodies(path, routes[path]), MAIN_EXAMPLES[path])


# Routes where the fuzz still gets an HTTP 500 (or a stream cut short) from SGLang's own
# handlers, not yet guarded; the server survives each. A route missing from this list that
# answers 5xx fails the test, and so does any death.
KNOWN_5XX: frozenset[str] = frozenset()  # routes allowed a 5xx: none


@pytest.mark.server
def test_every_other_client_route_never_gets_a_5xx(fuzz_server, fuzz_baseline) -> None:
    """Every other client route: the server never dies; no 5xx outside ``KNOWN_5XX``."""
    failures = {}
    for path, kind in fuzz_fields.serving_routes().items():
        if path in fuzz_fields.MAIN:
            continue
        try:
            _fuzz(fuzz_server, path, fuzz_fields.route_bodies(path, kind), OTHER_EXAMPLES)
        except AssertionError as exc:  # go on with the other routes while the server lives
            failures[path] = str(exc).splitlines()[0][:300]
            if not fuzz_server.alive():
                break
    REPORT[_policy(fuzz_server)]["known_5xx_routes"] = sorted(failures)
    assert fuzz_server.alive(), json.dumps(failures, indent=1)
    assert set(failures) <= KNOWN_5XX, json.dumps({p: f for p, f in failures.items() if p not in KNOWN_5XX}, indent=1)


@pytest.mark.server
def test_after_the_fuzz_the_server_answers_as_before(fuzz_server, fuzz_baseline) -> None:
    assert fuzz_server.alive()
    assert tokens(_normal(fuzz_server)) == fuzz_baseline
    assert wait_idle(fuzz_server) == 0
    assert "Scheduler hit an exception" not in fuzz_server.log_text()
    policy = _policy(fuzz_server)
    report = REPORT[policy]
    totals = Counter()
    for counts in report["status"].values():
        totals.update(counts)
    # The long run (scripts/reliability.sh --long) writes beside CI's figures, not over them.
    record(f"reliability/fuzz-{policy}" + (f"-x{SCALE:g}" if SCALE != 1 else ""), {
        "policy": policy, "scale": SCALE, "bodies": sum(totals.values()),
        "status": {str(k): v for k, v in sorted(totals.items())},
        "by_route": {p: {str(k): v for k, v in sorted(c.items())} for p, c in report["status"].items()},
        "fatal": report["fatal"], "routes_with_5xx": report.get("known_5xx_routes"),
        "same_tokens_after": True, "slots_in_use_after": 0})
