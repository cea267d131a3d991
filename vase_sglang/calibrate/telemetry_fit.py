"""Does the online signal predict the damage? The evicted attention beside the teacher-forced KL.

Per calibrated (policy, budget), every teacher-forced request (prompt x teacher x seed)
that ran at least one round gives a point: its evicted-attention statistics
(``telemetry.signal.STATISTICS``, from the rounds that affect a scored token) and its KL
per token. From the points:

* Spearman's rank correlation between each statistic and the KL, pooled over budgets and
  within each budget; the served statistic is the one with the best pooled correlation;
* isotonic mappings statistic -> KL per (policy, budget) and one over all points, each
  judged by leave-one-prompt-out error (fit without a prompt's requests, predict them),
  beside two baselines that ignore the signal (the mean KL of the pair's, or of all,
  training requests). The model-wide mapping is served when it predicts as well (held-out
  mean absolute error within ``AS_WELL`` of the per-pair one).

Requests that never evict are left out: their KL is exactly 0 and the server reports 0
for them without a mapping.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vase_sglang.telemetry.estimator import KLEstimator, KLMapping, fit_isotonic
from vase_sglang.telemetry.signal import STATISTICS, EvictedAttention

AS_WELL = 1.05  # the model-wide mapping is served when its held-out MAE is at most this x the per-pair one


def request_statistics(signals: Sequence[Sequence[Any]], end: int, row: int) -> dict[str, float | None]:
    """One request's statistics from an arm's ``signals`` ([generated, [N signals]] per
    round), counting the rounds that affect a scored position (<= ``end``)."""
    acc = EvictedAttention()
    for generated, per_row in signals:
        if generated + 1 <= end:
            acc.add(float(per_row[row]), int(generated))
    return acc.statistics(end)


def points_for(arm: dict[str, Any], ends: list[int], teachers: int) -> dict[str, list]:
    """Every request of one calibrated policy (all seeds): prompt, seed index, KL and statistics."""
    out: dict[str, list] = {"prompt": [], "seed": [], "kl": [], **{s: [] for s in STATISTICS}}
    for seed_index, (per_request, signals) in enumerate(zip(arm["seeds"], arm["signals"], strict=True)):
        for row, (kl, end) in enumerate(zip(per_request["kl"], ends, strict=True)):
            stats = request_statistics(signals, end, row)
            if stats["mean"] is None or kl is None or not math.isfinite(kl):
                continue
            out["prompt"].append(row // teachers)
            out["seed"].append(seed_index)
            out["kl"].append(float(kl))
            for name in STATISTICS:
                out[name].append(stats[name])
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = spearmanr(x, y).statistic
    return None if rho is None or not math.isfinite(rho) else float(rho)


def _errors(pred: list[float], truth: list[float]) -> dict[str, float | None]:
    p, t = np.asarray(pred), np.asarray(truth)
    if not len(t):
        return {"mae": None, "median_ae": None, "median_relative": None, "spearman": None, "n": 0}
    ae = np.abs(p - t)
    rel = ae[t > 0] / t[t > 0]
    return {"mae": float(ae.mean()), "median_ae": float(np.median(ae)),
            "median_relative": float(np.median(rel)) if len(rel) else None,
            "spearman": spearman(p.tolist(), t.tolist()), "n": int(len(t))}


def held_out(pairs: dict[tuple[str, int], dict[str, list]], statistic: str) -> dict[str, Any]:
    """Leave-one-prompt-out predictions of every point by four predictors."""
    prompts = sorted({p for pts in pairs.values() for p in pts["prompt"]})
    preds: dict[str, list[float]] = {"per_config": [], "model": [], "pair_mean": [], "model_mean": []}
    truth: list[float] = []
    for left_out in prompts:
        train_x: list[float] = []
        train_y: list[float] = []
        pair_fits = {}
        for key, pts in pairs.items():
            xs = [x for x, p in zip(pts[statistic], pts["prompt"], strict=True) if p != left_out]
            ys = [y for y, p in zip(pts["kl"], pts["prompt"], strict=True) if p != left_out]
            train_x += xs
            train_y += ys
            pair_fits[key] = (fit_isotonic(xs, ys, str(key)), float(np.mean(ys))) if xs else None
        if not train_x:
            continue
        model_fit, model_mean = fit_isotonic(train_x, train_y, "model-wide"), float(np.mean(train_y))
        for key, pts in pairs.items():
            for x, y, p in zip(pts[statistic], pts["kl"], pts["prompt"], strict=True):
                if p != left_out:
                    continue
                fit = pair_fits[key]
                truth.append(y)
                preds["model"].append(model_fit(x))
                preds["model_mean"].append(model_mean)
                preds["per_config"].append(fit[0](x) if fit else model_fit(x))
                preds["pair_mean"].append(fit[1] if fit else model_mean)
    return {name: _errors(p, truth) for name, p in preds.items()}


def analyse(cal: dict[str, Any], labels: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The ``telemetry`` section of calibration.json (None when the raw runs hold no signals,
    e.g. a calibration written before the telemetry existed)."""
    ends, teachers = cal["teacher"]["ends"], cal["setup"]["teachers"]
    raw = cal.get("raw", {})
    if not raw or any("signals" not in arm for r in raw.values() for k, arm in r.items() if k != "full"):
        return None
    pairs: dict[tuple[str, int], dict[str, list]] = {}
    for budget, arms in raw.items():
        for label, arm in arms.items():
            if label != "full":
                pts = points_for(arm, ends, teachers)
                if pts["kl"]:
                    pairs[label, int(budget)] = pts
    if not pairs:
        return None
    budgets = sorted({b for _, b in pairs})
    correlation: dict[str, dict[str, Any]] = {}
    for name in STATISTICS:
        pooled_x = [x for pts in pairs.values() for x in pts[name]]
        pooled_y = [y for pts in pairs.values() for y in pts["kl"]]
        correlation[name] = {
            "pooled": spearman(pooled_x, pooled_y), "n": len(pooled_x),
            "per_budget": {str(b): spearman([x for (_, bb), pts in pairs.items() if bb == b for x in pts[name]],
                                            [y for (_, bb), pts in pairs.items() if bb == b for y in pts["kl"]])
                           for b in budgets},
            "per_config": {f"{label} B={b}": spearman(pts[name], pts["kl"]) for (label, b), pts in pairs.items()},
        }
    statistic = max(STATISTICS, key=lambda n: float(correlation[n]["pooled"] if correlation[n]["pooled"] is not None
                                                    else -2.0))
    errors = held_out(pairs, statistic)
    pair_mae, model_mae = errors["per_config"]["mae"], errors["model"]["mae"]
    scope = "model" if model_mae is not None and pair_mae is not None and model_mae <= AS_WELL * pair_mae \
        else "per_config"
    model_fit = fit_isotonic([x for pts in pairs.values() for x in pts[statistic]],
                             [y for pts in pairs.values() for y in pts["kl"]], "model-wide")
    per_config = {key: fit_isotonic(pts[statistic], pts["kl"], f"{key[0]} B={key[1]}") for key, pts in pairs.items()}
    estimator = KLEstimator(statistic, model_fit, per_config if scope == "per_config" else {}, labels)
    points = {str(b): {label: {"prompt": pts["prompt"], "seed": pts["seed"], "evicted_attention": pts[statistic],
                               "kl": pts["kl"], "statistics": {n: pts[n] for n in STATISTICS}}
                       for (label, bb), pts in pairs.items() if bb == b} for b in budgets}
    never = {f"{label} B={b}": len(raw[str(b)][label]["seeds"]) * len(ends) - len(pts["kl"])
             for (label, b), pts in pairs.items()}
    return {"statistic": statistic, "spearman": correlation, "held_out": errors, "scope": scope,
            "estimator": estimator.to_dict(), "points": points,
            "fits": {"model": model_fit.to_dict(),
                     "per_config": [{"policy": k[0], "budget": k[1], "mapping": m.to_dict()}
                                    for k, m in per_config.items()]},
            "requests_without_rounds": never}


def _fmt(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(tel: dict[str, Any]) -> str:
    stat = tel["statistic"]
    c = tel["spearman"]
    budgets = list(c[stat]["per_budget"])
    lines = ["## Telemetry: does the evicted attention predict the KL?", "",
             "Per teacher-forced request (prompt x teacher x seed) that evicted: Spearman's rank correlation "
             "between its evicted-attention statistic and its KL per token, pooled over every calibrated policy "
             "and budget, and within each budget. The server maps the best pooled statistic to "
             f"`kv_estimated_kl`: **{stat}**.", "",
             "| statistic | pooled | " + " | ".join(f"B = {b}" for b in budgets) + " | requests |",
             "|---|---|" + "---|" * len(budgets) + "---|"]
    for name in STATISTICS:
        row = c[name]
        lines.append(f"| {name}{' (served)' if name == stat else ''} | {_fmt(row['pooled'])} | "
                     + " | ".join(_fmt(row["per_budget"][b]) for b in budgets) + f" | {row['n']} |")
    h = tel["held_out"]
    lines += ["", "Leave-one-prompt-out error of the KL estimate (nats/token; fit without a prompt's requests, "
              f"predict them). Served mapping: **{'model-wide' if tel['scope'] == 'model' else 'per (policy, budget)'}"
              "**.", "",
              "| predictor | MAE | median AE | median relative error | Spearman (prediction, KL) |",
              "|---|---|---|---|---|"]
    names = {"per_config": "isotonic per (policy, budget)", "model": "isotonic, model-wide",
             "pair_mean": "baseline: the pair's mean KL (no signal)", "model_mean": "baseline: the mean KL (no signal)"}
    for key, label in names.items():
        e = h[key]
        lines.append(f"| {label} | {_fmt(e['mae'], '.4f')} | {_fmt(e['median_ae'], '.4f')} | "
                     f"{_fmt(e['median_relative'], '.2f')} | {_fmt(e['spearman'])} |")
    weak = [k for k, v in c[stat]["per_config"].items() if v is not None and v < 0.5]
    if weak:
        lines += ["", f"Within one (policy, budget), {stat} ranks the requests' KL with rho < 0.5 for: "
                  + ", ".join(f"{k} ({_fmt(c[stat]['per_config'][k], '.2f')})" for k in weak) + "."]
    return "\n".join(lines) + "\n"


def plot(tel: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(tel["points"])
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.2 * len(budgets), 3.8), squeeze=False)
    estimator = KLEstimator.from_dict(tel["estimator"])
    for ax, b in zip(axes[0], budgets, strict=True):
        for label, pts in sorted(tel["points"][b].items()):
            ax.scatter(pts["evicted_attention"], pts["kl"], s=12, label=label, alpha=0.8)
        xs = np.linspace(0, max((x for pts in tel["points"][b].values() for x in pts["evicted_attention"]),
                                default=1.0), 100)
        mapping: KLMapping = estimator.model
        ax.plot(xs, [mapping(x) for x in xs], color="k", lw=1, label="model-wide fit")
        rho = tel["spearman"][tel["statistic"]]["per_budget"][b]
        ax.set(title=f"B = {b} (Spearman {_fmt(rho, '.2f')})", xlabel=f"evicted attention ({tel['statistic']})",
               ylabel="KL(full || policy), nats/token")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
