"""Fixes of SGLang 0.5.23's CPU engine (``SGLANG_USE_CPU_ENGINE=1``), not of eviction.

They are installed, part ``cpu_engine``, whenever the CPU engine is requested, whatever
the policy, because they make SGLang itself run on a CPU host as it would on a GPU one:

* ``DataParallelController.event_loop`` REPLACE: SGLang's loop polls the tokenizer's
  socket without blocking, over and over, so a ``--dp-size`` controller keeps one core
  busy while it has nothing to route. On a GPU host that core is spare; on a CPU host it
  is the engine's (a 2-core machine decodes at about half speed beside it). This loop
  waits on the socket (``zmq`` poll, at most ``POLL_MS``, then feeds the watchdog as
  SGLang's does) and drains it exactly as SGLang's does.
* ``init_model_parallel_group`` BEFORE: SGLang turns PyNccl on for every model-parallel
  group unless the device is an NPU or XPU, and PyNccl needs CUDA, so ``--tp-size 2``
  fails on the CPU engine ("Expected a cuda device, but got: cpu"). The hook asks for no
  PyNccl, custom all-reduce, MSCCL++ or symmetric-memory all-reduce: the group's
  collectives then go through torch.distributed over gloo, which SGLang's CPU platform
  already chose as the backend.
"""

from __future__ import annotations

from typing import Any

import zmq

from vase_sglang.plugin import contract as sg

from . import manifest
from .hooks import BEFORE, REPLACE, hook

# The longest an idle controller waits before it feeds its soft watchdog again: far below
# any watchdog timeout, and a request that arrives wakes the poll at once.
POLL_MS = 200


@hook("sglang.srt.managers.data_parallel_controller.DataParallelController.event_loop", REPLACE)
def dp_controller_event_loop(self: sg.DataParallelController) -> None:
    from sglang.srt.managers.io_struct import sock_recv

    while True:
        self.soft_watchdog.feed()
        if not self.recv_from_tokenizer.poll(POLL_MS):
            continue
        while True:
            self.soft_watchdog.feed()
            try:
                recv_req = sock_recv(self.recv_from_tokenizer, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            self._request_dispatcher(recv_req)


# The GPU communicators a model-parallel group may build; none runs on a CPU.
_GPU_COMMUNICATORS = ("use_pynccl", "use_custom_allreduce", "use_mscclpp", "use_torch_symm_mem_allreduce")
_GROUP = "sglang.srt.distributed.parallel_state.init_model_parallel_group"


@hook(_GROUP, BEFORE)
def model_parallel_group_without_gpu_communicators(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    # Every argument by name (the manifest's parameter list, checked against SGLang).
    params = manifest.BY_TARGET[_GROUP].params or ()
    named = {**dict(zip(params, args, strict=False)), **kwargs}
    named.update(dict.fromkeys(_GPU_COMMUNICATORS, False))
    return (), named
