"""The attention backends the eviction path supports, in one place: SGLang's
``--attention-backend`` name and the class whose ``forward_decode`` / ``forward_extend``
the query-capture hooks wrap (``decode.py``). ``server_args.py`` refuses any other
backend for an evicting policy. Each class's two methods are manifest entries."""

from __future__ import annotations

BACKEND_CLASSES = {
    "torch_native": "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend",
    "triton": "sglang.srt.layers.attention.triton_backend.TritonAttnBackend",
    "flashinfer": "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend",
}
SUPPORTED_BACKENDS = tuple(BACKEND_CLASSES)
