"""Helpers of the telemetry end-to-end tests: a calibration file with known mappings for the
tiny model, and a logit processor that plants an exact token sequence in a request's output."""

from __future__ import annotations

import json
from pathlib import Path

from support.constants import B, R
from vase_sglang.plugin.auto import CALIBRATION_KIND, CALIBRATION_VERSION, model_fingerprint
from vase_sglang.telemetry import KLEstimator, KLMapping

# kv_estimated_kl of the test server: 3 x the mean signal for vase at B, 2 x elsewhere (up to 0.5).
PAIR_SLOPE, MODEL_SLOPE = 3.0, 2.0


def write_tiny_calibration(path: Path, model: Path) -> Path:
    estimator = KLEstimator(
        "mean", KLMapping((0.0, 0.5), (0.0, MODEL_SLOPE * 0.5), "model-wide", 40),
        {("vase", B): KLMapping((0.0, 1.0), (0.0, PAIR_SLOPE), f"vase B={B}", 10)},
        {"vase": {"policy": "vase"}, "streamingllm": {"policy": "streamingllm"}})
    config = json.loads((model / "config.json").read_text())
    path.write_text(json.dumps({
        "kind": CALIBRATION_KIND, "version": CALIBRATION_VERSION, "setup": {"recent": R},
        "model": {"path": str(model), "fingerprint": model_fingerprint(config)},
        "recommendation": {str(B): {"policy": "vase", "label": "vase"}},
        "telemetry": {"estimator": estimator.to_dict()}}))
    return path


# Defined from source in a fresh "__main__" namespace: dill then pickles the class by value,
# so the server, which cannot import the tests' modules, runs it.
PLANT_SOURCE = """
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class PlantTokens(CustomLogitProcessor):
    \"\"\"Forces output token n to custom_params["plant"][n] while the plan lasts.\"\"\"

    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list or []):
            plan = (params or {}).get("plant")
            n = len(params["__req__"].output_ids) if plan else 0
            if plan and n < len(plan):
                logits[i, :] = float("-inf")
                logits[i, plan[n]] = 0.0
        return logits
"""


def plant_processor() -> str:
    """The serialized ``PlantTokens`` processor for a request's ``custom_logit_processor``."""
    namespace: dict = {"__name__": "__main__"}
    exec(PLANT_SOURCE, namespace)
    return namespace["PlantTokens"].to_str()
