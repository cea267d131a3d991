"""Locust load test: users stream chat completions through SGLang's OpenAI API.

Scenarios (select with ``--tags``; all run by default):

* ``long``   -- long reasoning: a fixed output length (``ignore_eos`` + ``min_tokens``).
* ``prefix`` -- shared-prefix fan-out: one long system prompt, many different questions,
  so the radix tree is exercised.
* ``mix``    -- short and long requests mixed.
* ``n``      -- ``n > 1`` parallel samples per request.
* ``abort``  -- the client disconnects after a few streamed chunks.
* ``override`` -- per-request ``custom_params`` (kv_budget, kv_policy, kv_seed).

``--max-requests N`` stops the run after N chat requests (the soak test uses it).

Each finished stream's last chunk carries the server's eviction telemetry (``metadata.kv``,
``--kv-telemetry on``): at the end the run prints, per scenario, the distribution of the
requests' evicted attention and estimated KL and the share that looped, and writes them to
``--telemetry-out FILE`` (JSON) when given.

Besides each request's end-to-end time, every response reports three Locust statistics
(request types ``TTFT``, ``TPOT``, ``ITL``; Locust prints p50/p90/p99 for each):
time to first token, time per output token after the first, and inter-token latency
(gap between streamed chunks).

Headless, against a running server (stops by itself after ``-t``):

    locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.0.1:30000 \
        --output-len 1024 --tags long prefix
"""

from __future__ import annotations

import json
import random
import statistics
import time

from locust import User, between, events, tag, task
from openai import OpenAI

SYSTEM_PROMPT = (
    "You are a careful assistant. Think step by step inside <think> and </think>, checking every "
    "intermediate result against the earlier ones before you answer. " * 8
)
QUESTIONS = [f"What is {a} plus {b}, and is the sum even?" for a in range(10, 40) for b in range(3, 9)]


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--output-len", type=int, default=512, help="tokens per long request (ignore_eos)")
    parser.add_argument("--short-len", type=int, default=32, help="tokens per short request in the mix")
    parser.add_argument("--model", default="default", help="model name sent to the OpenAI API")
    parser.add_argument("--samples", type=int, default=2, help="n for the parallel-samples scenario")
    parser.add_argument("--max-requests", type=int, default=0, help="stop after this many chat requests (0: no limit)")
    parser.add_argument("--overrides", default='[{"kv_budget": 64}, {"kv_policy": "streamingllm"}, {"kv_seed": 5}]',
                        help="JSON list of custom_params, one drawn per override request")
    parser.add_argument("--telemetry-out", default="", help="write the telemetry distributions to this JSON file")


_telemetry: list[dict] = []  # per finished choice: scenario name and its kv_* fields


def _quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "mean": statistics.fmean(values), "p50": qs[49], "p90": qs[89], "p99": qs[98]}


def telemetry_summary(records: list[dict]) -> dict:
    """Per scenario (and all together): evicted attention and estimated KL distributions of
    the requests that evicted, and the share of finished requests whose output looped."""
    out = {}
    for name in ["all", *sorted({r["name"] for r in records})]:
        rows = [r for r in records if name in ("all", r["name"])]
        out[name] = {"requests": len(rows),
                     "loop_share": statistics.fmean(bool(r.get("kv_loop")) for r in rows) if rows else None,
                     "evicted_attention": _quantiles([r["kv_evicted_attention"] for r in rows
                                                      if r.get("kv_evicted_attention") is not None]),
                     "estimated_kl": _quantiles([r["kv_estimated_kl"] for r in rows
                                                 if r.get("kv_estimated_kl") is not None
                                                 and r.get("kv_evicted_attention") is not None])}
    return out


@events.quitting.add_listener
def _report_telemetry(environment, **kwargs) -> None:
    if not _telemetry:
        return
    summary = telemetry_summary(_telemetry)
    print("eviction telemetry per scenario: " + json.dumps(summary))
    path = environment.parsed_options.telemetry_out
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)


_finished = 0
_ENV: list = []  # the Locust environment, for --max-requests


@events.init.add_listener
def _keep_env(environment, **kwargs) -> None:
    _ENV[:] = [environment]


@events.request.add_listener
def _stop_after_max_requests(request_type, name, response_time, response_length, exception=None, **kwargs) -> None:
    global _finished
    if request_type != "chat":
        return
    _finished += 1
    limit = _ENV[0].parsed_options.max_requests if _ENV else 0
    if limit and _finished == limit and _ENV[0].runner is not None:
        import gevent

        gevent.spawn(_ENV[0].runner.quit)  # not from inside this greenlet, which quit() kills


class ChatUser(User):
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        self.client = OpenAI(base_url=self.host.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
        self.opts = self.environment.parsed_options

    def _stream(self, name: str, messages: list[dict], max_tokens: int, n: int = 1, fixed_len: bool = True,
                custom_params: dict | None = None, stop_after: int = 0) -> None:
        extra: dict = {"ignore_eos": True, "min_tokens": max_tokens} if fixed_len else {}
        if custom_params:
            extra["custom_params"] = custom_params
        start = time.perf_counter()
        first = last = None
        gaps: list[float] = []
        chunks = 0
        try:
            stream = self.client.chat.completions.create(
                model=self.opts.model, messages=messages, max_tokens=max_tokens, n=n, temperature=0.7,
                stream=True, extra_body=extra,
            )
            for chunk in stream:
                if not chunk.choices:  # the last chunk: the server's telemetry of every choice
                    kv = (getattr(chunk, "metadata", None) or {}).get("kv") or []
                    _telemetry.extend({"name": name, **fields} for fields in kv if isinstance(fields, dict))
                    continue
                if not any(c.delta.content for c in chunk.choices):
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                chunks += 1
                if stop_after and chunks >= stop_after:
                    stream.close()  # the client goes away mid-generation
                    break
        except Exception as exc:  # noqa: BLE001 - every failure is a Locust failure
            events.request.fire(request_type="chat", name=name, response_time=(time.perf_counter() - start) * 1e3,
                                response_length=chunks, exception=exc)
            return
        total = (time.perf_counter() - start) * 1e3
        if first is None:
            events.request.fire(request_type="chat", name=name, response_time=total, response_length=0,
                                exception=RuntimeError("no tokens streamed"))
            return
        events.request.fire(request_type="chat", name=name, response_time=total, response_length=chunks)
        events.request.fire(request_type="TTFT", name=name, response_time=(first - start) * 1e3, response_length=0)
        if chunks > 1:
            tpot = (last - first) * 1e3 / (chunks - 1)
            events.request.fire(request_type="TPOT", name=name, response_time=tpot, response_length=0)
            for gap in gaps:
                events.request.fire(request_type="ITL", name=name, response_time=gap * 1e3, response_length=0)

    @tag("long")
    @task
    def long_reasoning(self) -> None:
        q = random.choice(QUESTIONS)
        self._stream("long", [{"role": "user", "content": q}], self.opts.output_len)

    @tag("prefix")
    @task
    def shared_prefix(self) -> None:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": random.choice(QUESTIONS)}]
        self._stream("prefix", messages, self.opts.output_len)

    @tag("mix")
    @task
    def short_and_long(self) -> None:
        long = random.random() < 0.3
        length = self.opts.output_len if long else self.opts.short_len
        self._stream("mix-long" if long else "mix-short", [{"role": "user", "content": random.choice(QUESTIONS)}],
                     length)

    @tag("n")
    @task
    def parallel_samples(self) -> None:
        self._stream("n", [{"role": "user", "content": random.choice(QUESTIONS)}], self.opts.short_len * 4,
                     n=self.opts.samples)

    @tag("abort")
    @task
    def disconnect(self) -> None:
        self._stream("abort", [{"role": "user", "content": random.choice(QUESTIONS)}], self.opts.output_len,
                     stop_after=random.randint(1, 8))

    @tag("override")
    @task
    def per_request_override(self) -> None:
        import json

        custom = random.choice(json.loads(self.opts.overrides))
        self._stream("override", [{"role": "user", "content": random.choice(QUESTIONS)}], self.opts.output_len,
                     custom_params=custom)
