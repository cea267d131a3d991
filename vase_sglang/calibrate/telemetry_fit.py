"""Does the online signal predict the damage? The evicted attention beside the teacher-forced KL.

Per calibrated (policy, budget), every teacher-forced request (prompt x teacher x seed)
that ran at least one round gives a point: its evicted-attention statistics
(``telemetry.signal.STATISTICS``, from the rounds that affect a scored token) and its KL
per token. From the points:

* Spearman's rank correlation between each statistic and the KL, pooled over budgets and
  within each budget; the served statistic is the one with the best pooled correlation;
* the same for ``exposure``, a signal-free baseline: the ``cumulative`` statistic with
  every round's signal set to 1 (the mean number of rounds before a token), which grows
  with the request's length past its first round exactly as the KL's dilution does. What
  the signal adds beyond it shows in the correlation across policies on the same request
  (same prompt, teacher and length: same exposure), reported per budget;
* isotonic mappings statistic -> KL per (policy, budget) and one over all points, each
  judged by leave-one-prompt-out error (fit without a prompt's requests, predict them),
  beside baselines that ignore the signal (the mean KL of the pair's, or of all, training
  requests; per-pair isotonic maps of the exposure). The model-wide mapping is served when
  it predicts as well (held-out mean absolute error within ``AS_WELL`` of the per-pair one). The
  mappings are stored as ``knots_only`` keeps them.

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

from vase_sglang.fidelity.outputs import save_png
from vase_sglang.telemetry.estimator import KLEstimator, KLMapping, fit_isotonic
from vase_sglang.telemetry.signal import STATISTICS, EvictedAttention

AS_WELL = 1.05  # the model-wide mapping is served when its held-out MAE is at most this x the per-pair one


EXPOSURE = "exposure"  # the signal-free baseline statistic


def knots_only(mapping: KLMapping) -> KLMapping:
    """``mapping`` without the knots inside a run of equal values. The same function
    (between two knots of one value it interpolates to that value) in fewer numbers: an
    isotonic fit's pooled blocks are runs of one value, so most knots go."""
    x, y = mapping.x, mapping.y
    keep = [i for i in range(len(x)) if i in (0, len(x) - 1) or not y[i - 1] == y[i] == y[i + 1]]
    return KLMapping(tuple(x[i] for i in keep), tuple(y[i] for i in keep), mapping.label, mapping.points)


def request_statistics(signals: Sequence[Sequence[Any]], end: int, row: int) -> dict[str, float | None]:
    """One request's statistics from an arm's ``signals`` ([generated, [N signals]] per
    round), counting the rounds that affect a scored position (<= ``end``), and its exposure."""
    acc, rounds = EvictedAttention(), EvictedAttention()
    for generated, per_row in signals:
        if generated + 1 <= end:
            acc.add(float(per_row[row]), int(generated))
            rounds.add(1.0, int(generated))
    return {**acc.statistics(end), EXPOSURE: rounds.statistic("cumulative", end)}


def points_for(arm: dict[str, Any], ends: list[int], teachers: int) -> dict[str, list]:
    """Every request of one calibrated policy (all seeds): prompt, seed index, KL and statistics."""
    out: dict[str, list] = {"prompt": [], "row": [], "seed": [], "kl": [], **{s: [] for s in (*STATISTICS, EXPOSURE)}}
    for seed_index, (per_request, signals) in enumerate(zip(arm["seeds"], arm["signals"], strict=True)):
        for row, (kl, end) in enumerate(zip(per_request["kl"], ends, strict=True)):
            stats = request_statistics(signals, end, row)
            if stats["mean"] is None or kl is None or not math.isfinite(kl):
                continue
            out["prompt"].append(row // teachers)
            out["row"].append(row)
            out["seed"].append(seed_index)
            out["kl"].append(float(kl))
            for name in (*STATISTICS, EXPOSURE):
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
    """Leave-one-prompt-out predictions of every point by five predictors."""
    prompts = sorted({p for pts in pairs.values() for p in pts["prompt"]})
    preds: dict[str, list[float]] = {"per_config": [], "model": [], "pair_exposure": [], "pair_mean": [],
                                     "model_mean": []}
    truth: list[float] = []
    for left_out in prompts:
        train: dict[str, list[float]] = {"x": [], "y": []}
        pair_fits = {}
        for key, pts in pairs.items():
            keep = [i for i, p in enumerate(pts["prompt"]) if p != left_out]
            xs, ys = [pts[statistic][i] for i in keep], [pts["kl"][i] for i in keep]
            train["x"] += xs
            train["y"] += ys
            pair_fits[key] = (fit_isotonic(xs, ys, str(key)), float(np.mean(ys)),
                              fit_isotonic([pts[EXPOSURE][i] for i in keep], ys, str(key))) if keep else None
        if not train["x"]:
            continue
        model_fit, model_mean = fit_isotonic(train["x"], train["y"], "model-wide"), float(np.mean(train["y"]))
        for key, pts in pairs.items():
            for i in (i for i, p in enumerate(pts["prompt"]) if p == left_out):
                x, fit = pts[statistic][i], pair_fits[key]
                truth.append(pts["kl"][i])
                preds["model"].append(model_fit(x))
                preds["model_mean"].append(model_mean)
                preds["per_config"].append(fit[0](x) if fit else model_fit(x))
                preds["pair_mean"].append(fit[1] if fit else model_mean)
                preds["pair_exposure"].append(fit[2](pts[EXPOSURE][i]) if fit else model_mean)
    errors = {name: _errors(p, truth) for name, p in preds.items()}
    for name in ("pair_mean", "model_mean"):  # constant within a fold: no ranking to speak of
        errors[name]["spearman"] = None
    return errors


def across_policies(pairs: dict[tuple[str, int], dict[str, list]], budget: int, statistic: str) -> dict[str, Any]:
    """Within one request (same prompt, teacher and length, the first seed), Spearman over
    the policies of the statistic against the KL; the mean over requests. The exposure is
    the same for every policy here, so this is what the signal's content ranks."""
    by_row: dict[int, list[tuple[float, float]]] = {}
    for (_, b), pts in pairs.items():
        if b != budget:
            continue
        for x, y, row, seed in zip(pts[statistic], pts["kl"], pts["row"], pts["seed"], strict=True):
            if seed == 0:
                by_row.setdefault(row, []).append((x, y))
    rhos = [r for group in by_row.values() if len(group) >= 4
            for r in [spearman([x for x, _ in group], [y for _, y in group])] if r is not None]
    return {"mean": float(np.mean(rhos)) if rhos else None, "requests": len(rhos),
            "policies": max((len(g) for g in by_row.values()), default=0)}


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
    for name in (*STATISTICS, EXPOSURE):
        pooled_x = [x for pts in pairs.values() for x in pts[name]]
        pooled_y = [y for pts in pairs.values() for y in pts["kl"]]
        correlation[name] = {
            "pooled": spearman(pooled_x, pooled_y), "n": len(pooled_x),
            "per_budget": {str(b): spearman([x for (_, bb), pts in pairs.items() if bb == b for x in pts[name]],
                                            [y for (_, bb), pts in pairs.items() if bb == b for y in pts["kl"]])
                           for b in budgets},
            "per_config": {f"{label} B={b}": spearman(pts[name], pts["kl"]) for (label, b), pts in pairs.items()},
        }
    for name in (*STATISTICS, EXPOSURE):
        correlation[name]["across_policies"] = {str(b): across_policies(pairs, b, name) for b in budgets}
    statistic = max(STATISTICS, key=lambda n: float(correlation[n]["pooled"] if correlation[n]["pooled"] is not None
                                                    else -2.0))
    errors = held_out(pairs, statistic)
    pair_mae, model_mae = errors["per_config"]["mae"], errors["model"]["mae"]
    scope = "model" if model_mae is not None and pair_mae is not None and model_mae <= AS_WELL * pair_mae \
        else "per_config"
    model_fit = knots_only(fit_isotonic([x for pts in pairs.values() for x in pts[statistic]],
                                        [y for pts in pairs.values() for y in pts["kl"]], "model-wide"))
    per_config = {key: knots_only(fit_isotonic(pts[statistic], pts["kl"], f"{key[0]} B={key[1]}"))
                  for key, pts in pairs.items()}
    estimator = KLEstimator(statistic, model_fit, per_config if scope == "per_config" else {}, labels)
    points = {str(b): {label: {"prompt": pts["prompt"], "seed": pts["seed"], "evicted_attention": pts[statistic],
                               "kl": pts["kl"], "statistics": {n: pts[n] for n in (*STATISTICS, EXPOSURE)}}
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
             f"`{EXPOSURE}` is no signal at all: the mean number of rounds before a token (the cumulative statistic "
             "with every signal set to 1), which tracks how much of a request comes after its first round. The "
             "last columns hold the length fixed: within one request, Spearman over the policies, mean over "
             "requests.", "",
             "| statistic | pooled | " + " | ".join(f"B = {b}" for b in budgets) + " | requests | "
             + " | ".join(f"across policies, B = {b}" for b in budgets) + " |",
             "|---|---|" + "---|" * len(budgets) + "---|" + "---|" * len(budgets)]
    for name in (*STATISTICS, EXPOSURE):
        row = c[name]
        label = f"{name} (served)" if name == stat else f"{name} (no signal)" if name == EXPOSURE else name
        lines.append(f"| {label} | {_fmt(row['pooled'])} | "
                     + " | ".join(_fmt(row["per_budget"][b]) for b in budgets) + f" | {row['n']} | "
                     + " | ".join(_fmt(row["across_policies"][b]["mean"]) for b in budgets) + " |")
    h = tel["held_out"]
    lines += ["", "Leave-one-prompt-out error of the KL estimate (nats/token; fit without a prompt's requests, "
              f"predict them). Served mapping: **{'model-wide' if tel['scope'] == 'model' else 'per (policy, budget)'}"
              "**.", "",
              "| predictor | MAE | median AE | median relative error | Spearman (prediction, KL) |",
              "|---|---|---|---|---|"]
    names = {"per_config": "isotonic per (policy, budget)", "model": "isotonic, model-wide",
             "pair_exposure": "baseline: isotonic per pair on the exposure (no signal)",
             "pair_mean": "baseline: the pair's mean KL (no signal)", "model_mean": "baseline: the mean KL (no signal)"}
    for key, label in names.items():
        e = h[key]
        lines.append(f"| {label} | {_fmt(e['mae'], '.4f')} | {_fmt(e['median_ae'], '.4f')} | "
                     f"{_fmt(e['median_relative'], '.2f')} | {_fmt(e['spearman'])} |")
    weak = [k for k, v in c[stat]["per_config"].items()
            if v is not None and (c[EXPOSURE]["per_config"].get(k) is None or v <= c[EXPOSURE]["per_config"][k])]
    if weak:
        lines += ["", f"Within one (policy, budget), {stat} ranks the requests' KL no better than the exposure for: "
                  + ", ".join(f"{k} ({_fmt(c[stat]['per_config'][k], '.2f')} vs "
                              f"{_fmt(c[EXPOSURE]['per_config'][k], '.2f')})" for k in weak) + "."]
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
    save_png(fig, path, dpi=110)
    plt.close(fig)
