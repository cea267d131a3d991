"""Pointer arithmetic in the Triton kernels is int64, checked on the source.

On an H200-sized pool (about 5e8 elements per layer at Qwen3-8B) ``layer * layer_stride``
overflows int32 from layer 5 on, and a compaction would write into another layer's or
request's KV. The Triton interpreter (``TRITON_INTERPRET=1``) computes in numpy int64 and
does not reproduce the wrap, so no CPU run can catch it: this test reads every
``@triton.jit`` function instead and requires

* every ``tl.program_id(i)`` to be widened at once: ``tl.program_id(i).to(tl.int64)``;
* every product with a stride parameter (``s_*``) to have an int64 other operand: a
  value widened with ``.to(tl.int64)``, or a name (or slice of one) assigned from an
  expression that contains one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _widened(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
            and any(ast.unparse(a) == "tl.int64" for a in node.args))


class _Checker(ast.NodeVisitor):
    def __init__(self, fn: ast.FunctionDef, where: str):
        self.where = where
        self.strides = {a.arg for a in fn.args.args if a.arg.startswith("s_")}
        self.wide: set[str] = set()
        self.problems: list[str] = []

    def is_wide(self, node: ast.AST) -> bool:
        if _widened(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.wide
        if isinstance(node, ast.Subscript):
            return self.is_wide(node.value)
        if isinstance(node, ast.BinOp):  # int32 op int64 promotes to int64
            return self.is_wide(node.left) or self.is_wide(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.is_wide(node.operand)
        return False

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        for name in names:
            (self.wide.add if self.is_wide(node.value) else self.wide.discard)(name)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        if ast.unparse(node.func) == "tl.program_id":
            self.problems.append(f"{self.where}: {ast.unparse(node)} is int32; widen it: .to(tl.int64)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # tl.program_id(i).to(tl.int64) is fine: skip the inner call.
        parent_call = node.value
        if node.attr == "to" and isinstance(parent_call, ast.Call) and ast.unparse(parent_call.func) == "tl.program_id":
            return
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self.generic_visit(node)
        if not isinstance(node.op, ast.Mult):
            return
        for stride, other in ((node.right, node.left), (node.left, node.right)):
            if isinstance(stride, ast.Name) and stride.id in self.strides and not self.is_wide(other):
                self.problems.append(f"{self.where}: {ast.unparse(node)} multiplies a stride by an int32 index")


def _problems(source: str, name: str) -> list[str]:
    problems = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef) and _is_jit(fn):
            checker = _Checker(fn, f"{name}:{fn.name}")
            for stmt in fn.body:
                checker.visit(stmt)
            problems += checker.problems
    return problems


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.name)
def test_kernel_index_math_is_int64(path: Path) -> None:
    assert _problems(path.read_text(), path.name) == []


def test_the_checker_finds_int32_offsets() -> None:
    bad = '''
@triton.jit
def k(buf_ptr, n_heads, s_bl, s_bs, BLOCK: tl.constexpr):
    lh = tl.program_id(1)
    layer = lh // n_heads
    offs = tl.arange(0, BLOCK)
    x = tl.load(buf_ptr + layer * s_bl + offs * s_bs)
'''
    found = _problems(bad, "bad.py")
    assert any("tl.program_id(1) is int32" in p for p in found)
    assert any("layer * s_bl" in p for p in found) and any("offs * s_bs" in p for p in found)
    good = '''
@triton.jit
def k(buf_ptr, slots_ptr, n_heads, s_bl, s_bs, s_sc, BLOCK: tl.constexpr):
    lh = tl.program_id(1).to(tl.int64)
    layer = lh // n_heads
    offs = tl.arange(0, BLOCK).to(tl.int64)
    slot = tl.load(slots_ptr + offs * s_sc).to(tl.int64)
    x = tl.load(buf_ptr + layer * s_bl + slot[:, None] * s_bs)
'''
    assert _problems(good, "good.py") == []


# ---- on a GPU: the kernels on a pool of real size ------------------------------------------
# 18 layers x (K, V) x 537,110 slots x 8 KV heads x 128 dims in bf16: 39.6 GB, a layer
# stride of 1.1e9 elements, so every layer from the 2nd on lies past 2**31 elements.
REAL_LAYERS, REAL_HEADS, REAL_DIM, REAL_LAYER_STRIDE = 18, 8, 128, 1_100_000_000


def _free_gpu_bytes() -> int:
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_free_gpu_bytes() < 45e9, reason="needs a GPU with 45 GB free (scripts/gpu_check.sh runs it)")
def test_kernels_at_a_real_pool_size() -> None:
    import math

    import torch

    from vase_sglang.config import PolicyConfig
    from vase_sglang.kernels import ops, reference
    from vase_sglang.policies import Regions, make_policy

    dev = torch.device("cuda")
    per_slot = REAL_HEADS * REAL_DIM
    n_slots = math.ceil(REAL_LAYER_STRIDE / (2 * per_slot))
    fused = torch.empty((REAL_LAYERS, 2, n_slots, REAL_HEADS, REAL_DIM), dtype=torch.bfloat16, device=dev)
    k_buf, v_buf = fused[:, 0], fused[:, 1]
    assert k_buf.stride(0) >= REAL_LAYER_STRIDE and (REAL_LAYERS - 1) * k_buf.stride(0) > 2**34
    cfg = PolicyConfig(policy="vase", budget=128, recent=32)
    n_req = 2
    g = torch.Generator(device=dev).manual_seed(0)
    # Regions scattered over the whole slot range (high slots included), plus sentinel rows.
    touched = torch.randperm(n_slots - 1, device=dev, generator=g)[: n_req * cfg.region_size + 64] + 1
    slots, sentinel = touched[: n_req * cfg.region_size].reshape(n_req, -1), touched[n_req * cfg.region_size :]
    for buf in (k_buf, v_buf):
        buf[:, touched] = torch.randn((REAL_LAYERS, touched.numel(), REAL_HEADS, REAL_DIM), device=dev,
                                      generator=g).to(torch.bfloat16)
    queries = torch.randn((n_req, REAL_LAYERS, 4 * REAL_HEADS, cfg.recent, REAL_DIM), device=dev,
                          generator=g).to(torch.bfloat16)
    sentinel_before = (k_buf[:, sentinel].clone(), v_buf[:, sentinel].clone())
    # The same data in a small dense pool, where int32 offsets would be fine.
    small = Regions.from_dense(reference.gather_region(k_buf, slots), reference.gather_region(v_buf, slots), queries)
    cand, small_cand = slots[:, : cfg.budget], small.candidates(cfg.recent)
    torch.testing.assert_close(ops.value_stat(v_buf, cand, "range", backend="triton"),
                               reference.value_stat(small.v_buf, small_cand, "range"))
    torch.testing.assert_close(ops.window_attention_score(queries, k_buf, cand, backend="triton"),
                               reference.window_attention_score(queries, small.k_buf, small_cand),
                               rtol=3e-2, atol=1e-4)
    keep = make_policy(cfg, backend="torch").select(small)
    ops.compact(k_buf, v_buf, slots, keep, backend="triton")
    reference.compact(small.k_buf, small.v_buf, small.slots, keep)
    for layer in (0, 1, 2, REAL_LAYERS - 1):  # layer 2 on is past 2**31 elements
        assert torch.equal(k_buf[layer, slots], small.k_buf[layer, small.slots]), f"K of layer {layer}"
        assert torch.equal(v_buf[layer, slots], small.v_buf[layer, small.slots]), f"V of layer {layer}"
    assert torch.equal(k_buf[:, sentinel], sentinel_before[0]) and torch.equal(v_buf[:, sentinel], sentinel_before[1])
