"""Calibration: measure which policy and budget keep a model closest to its full cache
(``python -m vase_sglang.calibrate``); ``--kv-policy auto`` serves the answer."""
