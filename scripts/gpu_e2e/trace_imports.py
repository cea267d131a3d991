"""Import SGLang's GPU serving path as the device tool's H200 would, on a machine without a GPU.

Run with the carry and the H200 stand-in on PYTHONPATH and ``run.KIT_ENV`` in the environment
(``rehearse.py`` does this). CUDA is faked (``torch.cuda.is_available``, ``torch.version.cuda``,
an sm_90 device), flashinfer must be absent, and every module a GPU server's processes import on the
dense Qwen3/Llama path with the triton backend is imported; then the plugin's hook manifest is
checked against what was imported. Prints one JSON object; exit status 1 when anything failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import traceback

# The modules a GPU server's main, scheduler and detokenizer processes import on this path.
MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.models.qwen3",
    "sglang.srt.models.llama",
    "vase_sglang.plugin",
    "vase_sglang.plugin.scheduler",
    "vase_sglang.kernels.ops",
    "vase_sglang.patches.decode",
    "vase_sglang.patches.tree",
    "vase_sglang.patches.admission",
    "vase_sglang.patches.memory",
    "vase_sglang.patches.io",
    "vase_sglang.patches.guards.lifecycle",
    "vase_sglang.patches.guards.bodies",
    "vase_sglang.patches.guards.routes",
    "vase_sglang.patches.server_args",
)


def fake_cuda() -> None:
    import torch

    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200 (faked)"


def main() -> int:
    fake_cuda()
    failures: dict[str, str] = {}
    for name in MODULES:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - SystemExit too: record every module that fails
            failures[name] = "".join(traceback.format_exception(e))[-1500:]
    report: dict = {"modules": len(MODULES), "failed": failures,
                    "sglang_modules_loaded": sum(m.startswith("sglang") for m in sys.modules)}
    sgl_kernel = sys.modules.get("sgl_kernel")
    report["sgl_kernel"] = getattr(sgl_kernel, "__version__", None)
    report["sgl_kernel_is_stand_in"] = bool(getattr(sgl_kernel, "VASE_STAND_IN", False))
    # The H200 has no flashinfer, and neither may this path (the rehearsal's base has none).
    report["flashinfer_findable"] = importlib.util.find_spec("flashinfer") is not None
    try:
        from sglang.srt.utils import is_flashinfer_available

        report["sglang_sees_flashinfer"] = bool(is_flashinfer_available())
    except Exception as e:  # noqa: BLE001
        failures["sglang.srt.utils.is_flashinfer_available"] = repr(e)
    try:
        from vase_sglang.patches import manifest

        report["manifest_errors"] = manifest.check_all()
    except Exception as e:  # noqa: BLE001
        failures["vase_sglang.patches.manifest"] = "".join(traceback.format_exception(e))[-1500:]
    import torch
    import transformers
    import triton

    report["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
                          "transformers": transformers.__version__}
    print(json.dumps(report, indent=2))
    ok = not failures and report["sgl_kernel_is_stand_in"] and not report["flashinfer_findable"] \
        and not report.get("sglang_sees_flashinfer") and not report.get("manifest_errors")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
