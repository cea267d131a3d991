"""Constants several test modules must agree on, defined once."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# The end-to-end servers' policy: budget, recent window and server seed.
B, R, SEED = 128, 32, 7
REGION = B + R
VASE_ARGS = ("--kv-policy", "vase", "--kv-budget", str(B), "--kv-recent", str(R), "--kv-seed", str(SEED))
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42]

# Prompt 12 tokens + 1000 generated: full cache holds 2 such requests in 2150 slots, not 3.
ADMISSION_POOL = 2150
# A pool where 16 concurrent vase requests (12 + 160 slots each) cannot all run at once.
LOAD_POOL = 1200
