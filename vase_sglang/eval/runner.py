"""Send a suite to a server through the OpenAI API, one arm (policy, budget) at a time.

The policy of each request travels in ``custom_params`` (``kv_policy``, ``kv_budget``,
``kv_seed``), so one server started with an evicting policy can run every arm. Sample j
of a problem uses seed ``seed + j`` for both the sampler (``seed``; SGLang honours it
only with ``--enable-deterministic-inference``) and the eviction policy (``kv_seed``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass

from tqdm import tqdm

from vase_sglang.eval.signatures import has_loop, unclosed_think
from vase_sglang.eval.suites import Problem


class EvalError(Exception):
    """A failure the user must see in one line (unreachable server, rejected request)."""


@dataclass(frozen=True)
class Arm:
    policy: str
    budget: int | None  # None: the full cache

    @property
    def label(self) -> str:
        return "none" if self.budget is None else f"{self.policy}@{self.budget}"


@dataclass(frozen=True)
class Sampling:
    k: int = 4
    seed: int = 0
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 1100


@dataclass
class Sample:
    problem: str
    seed: int
    correct: bool
    tokens: int
    loop: bool
    unclosed: bool
    finish_reason: str | None
    text: str
    # The server's own telemetry of the request (metadata.kv), None when it sends none.
    served_loop: bool | None = None  # its online loop detector
    evicted_attention: float | None = None  # mean over rounds
    estimated_kl: float | None = None  # with --kv-calibration

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "text"}


def custom_params(arm: Arm, seed: int) -> dict:
    if arm.budget is None:
        return {"kv_policy": "none"}
    return {"kv_policy": arm.policy, "kv_budget": arm.budget, "kv_seed": seed}


def _client(url: str, timeout: float):
    from openai import OpenAI

    return OpenAI(base_url=url.rstrip("/") + "/v1", api_key="EMPTY", timeout=timeout, max_retries=0)


def served_model(url: str, timeout: float = 10.0) -> str:
    """The server's model id; EvalError naming the URL when it cannot be reached."""
    import openai

    try:
        models = _client(url, timeout).models.list().data
    except openai.APIConnectionError as e:
        raise EvalError(f"cannot reach the server at {url} ({e.__cause__ or e})") from None
    except openai.APIStatusError as e:
        raise EvalError(f"server at {url} answered /v1/models with HTTP {e.status_code}") from None
    if not models:
        raise EvalError(f"server at {url} serves no model")
    return models[0].id


def _output_text(message) -> str:
    """The whole output; a server with --reasoning-parser splits the thinking off."""
    reasoning = getattr(message, "reasoning_content", None)
    content = message.content or ""
    return f"<think>{reasoning}</think>{content}" if reasoning else content


def _one(client, model: str, problem: Problem, arm: Arm, seed: int, sampling: Sampling) -> Sample:
    import openai

    try:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": problem.prompt}], max_tokens=sampling.max_tokens,
            temperature=sampling.temperature, top_p=sampling.top_p, seed=seed,
            extra_body={"custom_params": custom_params(arm, seed)})
    except openai.APIConnectionError as e:
        raise EvalError(f"lost the server during {arm.label} ({e.__cause__ or e})") from None
    except openai.APIStatusError as e:
        detail = e.body.get("message", e.body) if isinstance(e.body, dict) else e.body
        raise EvalError(f"server rejected a {arm.label} request (HTTP {e.status_code}): {detail}") from None
    choice = r.choices[0]
    text = _output_text(choice.message)
    kv = served_telemetry(r)
    return Sample(problem=problem.id, seed=seed, correct=problem.grade(text), tokens=r.usage.completion_tokens,
                  loop=has_loop(text), unclosed=unclosed_think(text), finish_reason=choice.finish_reason, text=text,
                  served_loop=kv.get("kv_loop"), evicted_attention=kv.get("kv_evicted_attention"),
                  estimated_kl=kv.get("kv_estimated_kl"))


def served_telemetry(response) -> dict:
    """The first choice's ``kv_*`` fields from the response's ``metadata.kv`` ({} without)."""
    metadata = getattr(response, "metadata", None) or (response.model_extra or {}).get("metadata") or {}
    kv = metadata.get("kv") if isinstance(metadata, dict) else None
    return kv[0] if isinstance(kv, list) and kv and isinstance(kv[0], dict) else {}


def run_arm(url: str, model: str, problems: list[Problem], arm: Arm, sampling: Sampling, concurrency: int,
            timeout: float = 3600.0) -> list[Sample]:
    """All k samples of every problem for one arm; stops at the first failed request."""
    client = _client(url, timeout)
    jobs = [(p, sampling.seed + j) for p in problems for j in range(sampling.k)]
    samples: list[Sample] = []  # appended by this thread only: as_completed yields here
    with ThreadPoolExecutor(max_workers=concurrency) as pool, \
            tqdm(total=len(jobs), desc=f"{arm.label:>18}", unit="sample", dynamic_ncols=True, mininterval=2.0) as bar:
        futures = [pool.submit(_one, client, model, p, arm, s, sampling) for p, s in jobs]
        try:
            for f in as_completed(futures):
                samples.append(f.result())
                bar.set_postfix(acc=f"{sum(x.correct for x in samples) / len(samples):.2f}")
                bar.update()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    order = {(p.id, s): i for i, (p, s) in enumerate(jobs)}
    return sorted(samples, key=lambda x: order[(x.problem, x.seed)])
