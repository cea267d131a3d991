"""Test set-up shared by every test module.

Without a GPU the Triton kernels run under the interpreter; the variable must be set
before any kernel module is imported, which is why it is set here, at collection time.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
