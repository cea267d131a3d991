"""Request I/O: per-request validation, meta_info fields, ``GET /kv_policy`` and metrics.

Main process:

* ``SamplingParams.verify`` AFTER: a bad or unknown ``custom_params`` kv field raises
  ValueError, which SGLang turns into HTTP 400; the server keeps running. Valid ones
  become the request's ``RequestOptions``, carried in ``custom_params`` so the scheduler
  does not validate them again.
* ``TokenizerManager.update_request_meta_info`` AROUND: our meta_info values are
  scalars, not per-token lists.
* ``http_server.launch_server`` BEFORE: add ``GET /kv_policy``.

Scheduler process:

* ``Scheduler.get_output_streamer_class`` REPLACE: send ``META_KEYS`` with every output:
  the counters ``kv_region_len``, ``kv_evicted_tokens``, ``kv_eviction_rounds``,
  ``kv_reprefilled_tokens`` (per retraction, the generated tokens re-prefilled,
  comma-separated); the choice ``kv_policy`` (the policy the request runs) and
  ``kv_policy_reason`` (why: the server's flag, the request's field, or ``auto``'s
  calibration); with ``--kv-telemetry on`` the telemetry signals (``kv_evicted_attention``,
  ``kv_evicted_attention_max``, ``kv_loop``, ``kv_loop_start``) and, with
  ``--kv-calibration`` too, the KL estimate (``kv_estimated_kl``, ``kv_kl_mapping``);
  see ``plugin.telemetry.TelemetryReport``. The streamer is a subclass of SGLang's; what
  it overrides is declared in ``contract.SchedulerOutputStreamer``.
* ``SchedulerInternalStateController.get_internal_state`` AFTER: live totals, which
  ``/kv_policy`` reads through SGLang's own internal-state request
  (``http_server.get_global_state().tokenizer_manager.get_internal_state()``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from vase_sglang.plugin import contract as sg
from vase_sglang.plugin import telemetry
from vase_sglang.plugin.options import OPTIONS_KEY, carry, request_options, server_reason
from vase_sglang.plugin.report import PolicyChoice, RequestCounters
from vase_sglang.plugin.settings import imported_settings

from . import openai_meta, runtime
from .hooks import AFTER, AROUND, BEFORE, REPLACE, hook

logger = logging.getLogger("vase_sglang.patches.io")

# meta_info key of each field: kv_<field>
COUNTER_FIELDS = tuple(f.name for f in dataclasses.fields(RequestCounters))
CHOICE_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyChoice))
TELEMETRY_FIELDS = (*telemetry.SIGNAL_FIELDS, *telemetry.ESTIMATE_FIELDS)
META_KEYS = tuple(f"kv_{name}" for name in (*COUNTER_FIELDS, *CHOICE_FIELDS, *TELEMETRY_FIELDS))


@hook("sglang.srt.sampling.sampling_params.SamplingParams.verify", AFTER)
def _verify_custom_params(result: Any, params: Any, *args: Any, **kwargs: Any) -> None:
    custom = getattr(params, "custom_params", None)
    if isinstance(custom, dict):
        custom.pop(OPTIONS_KEY, None)  # only this hook writes it: a client's copy is not trusted
    if custom:
        options = request_options(imported_settings(), custom)  # PolicyConfigError is a ValueError -> 400
        if isinstance(custom, dict) and any(str(k).startswith("kv_") for k in custom):
            carry(custom, options)


@hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info", AROUND)
def _scalar_meta(original, manager: Any, meta_info: dict, *args: Any, **kwargs: Any) -> None:
    original(manager, meta_info, *args, **kwargs)
    for key in META_KEYS:
        value = meta_info.get(key)
        if isinstance(value, list) and value:
            meta_info[key] = value[-1]
    finish_reason = kwargs.get("finish_reason", args[3] if len(args) > 3 else None)
    if finish_reason is not None:  # the request's last output: kept for the OpenAI routes' final chunk
        openai_meta.remember(meta_info)


def _meta_for(req: Any) -> RequestCounters:
    sched = runtime.adapter()
    return sched.counters(req) if sched is not None else RequestCounters.before_first_decode(req)


def _choice_for(req: Any) -> PolicyChoice:
    sched = runtime.adapter()
    if sched is not None:
        return sched.policy_choice(req)
    settings = imported_settings()
    return PolicyChoice(settings.config.policy, server_reason(settings.config, settings.auto))


def _telemetry_fields(reqs: list) -> dict[str, list]:
    """The telemetry meta_info fields of each request (none with --kv-telemetry off; the
    KL estimate only with --kv-calibration)."""
    sched = runtime.adapter()
    if sched is None or not sched.settings.telemetry.enabled:
        return {}
    estimates = telemetry.ESTIMATE_FIELDS if sched.settings.telemetry.estimator is not None else ()
    reports = [sched.telemetry_report(r) for r in reqs]
    return {f"kv_{name}": [[getattr(report, name)] for report in reports]
            for name in telemetry.SIGNAL_FIELDS + estimates}


def _streamer_class() -> type:
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    # Overrides the two names contract.SchedulerOutputStreamer declares (checked offline).
    class VaseOutputStreamer(SchedulerOutputStreamer):
        has_additional_customized_info = True

        def build_additional_customized_info(self, reqs: list) -> dict[str, list]:
            base = super().build_additional_customized_info(reqs)
            for records, names in (([_meta_for(r) for r in reqs], COUNTER_FIELDS),
                                   ([_choice_for(r) for r in reqs], CHOICE_FIELDS)):
                for name in names:
                    base[f"kv_{name}"] = [[getattr(record, name)] for record in records]
            base.update(_telemetry_fields(reqs))
            return base

    return VaseOutputStreamer


@hook("sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class", REPLACE)
def _get_output_streamer_class(scheduler: Any) -> type:
    return _streamer_class()


def totals() -> dict[str, Any]:
    sched = runtime.adapter()
    return sched.summary() if sched is not None else {}


@hook("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state",
      AFTER)
def _internal_state(result: sg.GetInternalStateReqOutput, controller: Any, *args: Any, **kwargs: Any) -> None:
    result.internal_state["vase"] = totals()


async def kv_policy_route() -> dict[str, Any]:
    from sglang.srt.entrypoints import http_server

    settings = imported_settings()
    cfg = settings.config
    live = {}
    state: sg.GlobalState | None = http_server.get_global_state()  # None until launch_server sets it
    manager = state.tokenizer_manager if state is not None else None
    if manager is not None:
        states = await manager.get_internal_state()
        per_rank = [s.get("vase", {}) for s in states]
        counted = [r for r in per_rank if r.get("counted_in_totals", True)]  # one rank per TP group
        live = {k: sum(r.get(k) or 0 for r in counted) for k in ("eviction_rounds", "tokens_evicted")}
        live["telemetry"] = telemetry.merge([(r.get("telemetry") or {}).get("by_config") or {} for r in counted])
        live["per_rank"] = per_rank
    auto = settings.auto
    choice = None if auto is None else {"table": auto.to_dict(), "at_server_budget": auto.choose(cfg.budget).reason}
    options = settings.telemetry
    shown = {"enabled": options.enabled, "stop_on_loop": options.stop_on_loop,
                "kl_estimator": None if options.estimator is None else {
                    "source": options.estimator.source, "statistic": options.estimator.statistic,
                    "scope": "per (policy, budget)" if options.estimator.per_config else "model-wide"}}
    return {"policy": "auto" if auto is not None else cfg.policy, "config": cfg.to_dict(), "auto": choice,
            "telemetry": shown, "totals": live}


def add_kv_policy_route() -> None:
    from sglang.srt.entrypoints.http_server import app

    if not any(getattr(r, "path", None) == "/kv_policy" for r in app.routes):
        app.add_api_route("/kv_policy", kv_policy_route, methods=["GET"])


@hook("sglang.srt.entrypoints.http_server.launch_server", BEFORE)
def _add_route(*args: Any, **kwargs: Any) -> None:
    add_kv_policy_route()
