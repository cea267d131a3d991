"""From per-request metrics to a recommendation: intervals over prompts, the best policy
per budget, whether its lead holds, and the smallest budget within a KL target."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vase_sglang import registry
from vase_sglang.fidelity.outputs import save_png
from vase_sglang.registry import EVICTING

# Serving configurations a calibration compares: name -> PolicyConfig changes. Every
# registered evicting policy as it is, each followed by its variants (VaSE with the
# outlier-only reservation).
VARIANTS: dict[str, dict[str, Any]] = {"vase-outliers": {"policy": "vase", "outlier_factor": 5.0}}
CANDIDATES: dict[str, dict[str, Any]] = {}
for _name in EVICTING:
    CANDIDATES[_name] = {"policy": _name}
    CANDIDATES.update({label: changes for label, changes in VARIANTS.items() if changes["policy"] == _name})
# Drawing noise per request or round: run with every --seeds value. CurDKV's seed only picks
# its one fixed sketch.
STOCHASTIC = tuple(name for name, changes in CANDIDATES.items() if registry.spec(changes["policy"]).stochastic)
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def _nanmean(x: np.ndarray, axis: int | None = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice is NaN, as intended
        return np.nanmean(x, axis=axis)


def per_prompt(values: list[list[float]], n_prompts: int) -> np.ndarray:
    """Per-request values of several seeds ``[seeds][rows]`` (rows prompt-major, equal
    teachers per prompt) -> one value per prompt: mean over seeds and teachers."""
    arr = np.asarray(values, dtype=np.float64)  # [seeds, rows]
    return _nanmean(arr.reshape(arr.shape[0], n_prompts, -1).transpose(1, 0, 2).reshape(n_prompts, -1), axis=1)


def interval(x: np.ndarray, seed: int = 0) -> tuple[float, float] | None:
    """95 % percentile bootstrap interval of the mean over prompts (None below 3 prompts)."""
    from scipy.stats import bootstrap

    x = x[~np.isnan(x)]
    if len(x) < 3 or np.all(x == x[0]):
        return (float(x[0]), float(x[0])) if len(x) >= 3 else None
    res = bootstrap((x,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=CONFIDENCE,
                    method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class PolicyRow:
    name: str
    kl: float
    kl_ci: tuple[float, float] | None
    agree: float
    agree_ci: tuple[float, float] | None
    dnll: float
    dnll_ci: tuple[float, float] | None
    rounds: float
    kl_seed_sd: float | None = None  # spread of the mean KL over seeds (stochastic policies)
    diff: float = 0.0  # mean over prompts of (KL - best's KL), paired per prompt
    diff_ci: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def analyse_budget(arms: dict[str, dict], n_prompts: int) -> dict[str, Any]:
    """``arms``: candidate name -> {"seeds": [per-request dicts], "rounds": [...]} plus "full"."""
    full_nll = np.asarray(arms["full"]["per_request"]["nll"], dtype=np.float64)
    rows: list[PolicyRow] = []
    kl_by: dict[str, np.ndarray] = {}
    for name, arm in arms.items():
        if name == "full":
            continue
        seeds = arm["seeds"]
        kl = per_prompt([s["kl"] for s in seeds], n_prompts)
        agree = per_prompt([s["agree"] for s in seeds], n_prompts)
        dnll = per_prompt([(np.asarray(s["nll"]) - full_nll).tolist() for s in seeds], n_prompts)
        kl_by[name] = kl
        per_seed = [float(_nanmean(per_prompt([s["kl"]], n_prompts))) for s in seeds]
        rows.append(PolicyRow(name, float(_nanmean(kl)), interval(kl), float(_nanmean(agree)), interval(agree),
                              float(_nanmean(dnll)), interval(dnll), float(np.mean(arm["rounds"])),
                              float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None))
    rows.sort(key=lambda r: r.kl)
    best = rows[0]
    for r in rows:
        d = kl_by[r.name] - kl_by[best.name]
        r.diff = float(_nanmean(d))
        r.diff_ci = interval(d) if r is not best else (0.0, 0.0)
    # The lead holds when every other policy's paired difference interval lies above 0.
    lead = len(rows) > 1 and all(r.diff_ci is not None and r.diff_ci[0] > 0 for r in rows[1:])
    return {"policies": [r.to_dict() for r in rows], "recommended": best.name, "lead_beyond_interval": lead,
            "runner_up": rows[1].name if len(rows) > 1 else None}


def recommendation(per_budget: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The calibration file's table: budget -> the recommended policy's config changes."""
    return {str(b): {**CANDIDATES[a["recommended"]], "label": a["recommended"]} for b, a in sorted(per_budget.items())}


def smallest_within(per_budget: dict[int, dict[str, Any]], target_kl: float) -> int | None:
    for b, a in sorted(per_budget.items()):
        if a["policies"][0]["kl"] <= target_kl:
            return b
    return None


def _fmt_ci(ci: Any, fmt: str = ".3f") -> str:
    return f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]" if ci else "n/a"


def markdown(cal: dict[str, Any]) -> str:
    setup = cal["setup"]
    lines = [f"# Calibration of `{Path(cal['model']['path']).name}`", "",
             f"{setup['prompts']} prompts ({setup['prompt_source']}) x {setup['teachers']} teacher(s), "
             f"{setup['teacher']}, up to {setup['tokens']} tokens (scored to each teacher's natural end; "
             f"mean length {setup.get('teacher_mean_length', 0):.0f}), R = {setup['recent']}, seeds {setup['seeds']}. "
             "KL(full || policy) in nats per scored token, mean over prompts (and seeds) with a 95 % bootstrap "
             "interval over prompts; seeds' sd = standard deviation of the mean KL across seeds; "
             "Δ = paired difference to the best policy's KL; dNLL = NLL of the teacher's tokens minus the full "
             "cache's.", "", f"Command: `{setup['command']}`", ""]
    for b, a in sorted(cal["budgets"].items(), key=lambda kv: int(kv[0])):
        lead = "beyond the interval" if a["lead_beyond_interval"] else "within the interval (not a clear win)"
        lines += [f"## B = {b}: recommended **{a['recommended']}** (lead over {a['runner_up']}: {lead}); "
                  f"{100 * a['evicted_share']:.0f} % of scored tokens come after the first round", "",
                  "| policy | KL | KL 95 % | seeds' sd | Δ to best | Δ 95 % | top-1 agree [95 %] | dNLL [95 %] "
                  "| rounds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in a["policies"]:
            sd = f"{r['kl_seed_sd']:.4f}" if r.get("kl_seed_sd") is not None else "-"
            lines.append(f"| {r['name']} | {r['kl']:.4f} | {_fmt_ci(r['kl_ci'], '.4f')} | {sd} | {r['diff']:+.4f} | "
                         f"{_fmt_ci(r['diff_ci'], '+.4f')} | {r['agree']:.3f} {_fmt_ci(r.get('agree_ci'))} | "
                         f"{r['dnll']:+.4f} {_fmt_ci(r.get('dnll_ci'), '+.4f')} | "
                         f"{r['rounds']:.1f} |")
        lines.append("")
    target = cal.get("target_kl")
    if target is not None:
        within = cal.get("smallest_budget_within_target")
        lines.append(f"Smallest calibrated budget with KL <= {target}: "
                     + (f"**{within}**" if within is not None else "none of those measured") + ".")
    return "\n".join(lines) + "\n"


def plot(cal: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted(cal["budgets"], key=int)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in CANDIDATES:
        xs, ys, lo, hi = [], [], [], []
        for b in budgets:
            row = next((r for r in cal["budgets"][b]["policies"] if r["name"] == name), None)
            if row is None or not math.isfinite(row["kl"]):
                continue
            ci = row["kl_ci"] or (row["kl"], row["kl"])
            xs.append(int(b))
            ys.append(row["kl"])
            lo.append(row["kl"] - ci[0])
            hi.append(ci[1] - row["kl"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], label=name, marker="o", capsize=3,
                        lw=2.2 if name.startswith("vase") else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1e-3)  # log above 1e-3; a budget that never evicts has KL 0
    ax.set_ylim(bottom=0)
    ax.set_xlabel("budget B (tokens per layer and KV head)")
    ax.set_ylabel("KL(full || policy), nats/token")
    ax.set_title(f"{Path(cal['model']['path']).name}, R={cal['setup']['recent']}: KL to the full cache\n"
                 "(mean, 95 % interval over prompts)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
