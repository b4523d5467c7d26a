"""Adding a region kind is new code plus one row per stage table (issue 18), shown
with a toy kind: ``neg`` as a "toy_neg" region. Its IR types, operand reader, region
maker, kernel choice, emitter and region module live in this file; the only edits
to the package are one row in each table (monkeypatched here): the pattern table,
select's CHOOSERS, emit's emitters and the runtime's MODULES. Then the ordinary
pipeline partitions, selects, reports, emits and offloads it. No GPU, no nvcc."""
from dataclasses import dataclass, field

import torch

from cutlass_offload import emit, select
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import GemmEpilogue, KernelConfig, KernelSource
from cutlass_offload.ir.common import _Region
from cutlass_offload.partition import partition, patterns
from cutlass_offload.partition.graph_utils import aten, tensor_dtype
from cutlass_offload.report import Report
from cutlass_offload.runtime import compiled_model
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.region import RegionModule


@dataclass(frozen=True)
class ToyProblem:
    dtype: str
    epilogue: GemmEpilogue = GemmEpilogue()

    def summary(self) -> dict:
        return {"toy": {"dtype": self.dtype}}


@dataclass(frozen=True)
class ToyRegion(_Region):
    name: str
    form: str
    nodes: tuple
    x: str
    problem: ToyProblem
    notes: tuple = ()


@dataclass(frozen=True)
class ToyKernel:
    arch: str
    dtype: str
    config: KernelConfig = field(default_factory=lambda: KernelConfig("rowwise_norm", (1, 1, 1), 0))
    kind = "toy_neg"
    args_type = "CoNormArgs"

    @property
    def name(self) -> str:
        return f"toy_neg_{self.dtype}"


def toy_operands(node, options):
    return node.args[0]


def make_toy(index, node, x, options, taken):
    region = ToyRegion(name=f"region{index}_toy_neg", form="toy_neg", nodes=(node.name,), x=x.name,
                       problem=ToyProblem(tensor_dtype(x, "input")))
    return region, [node]


class ToyEmitter:
    @staticmethod
    def emit(kernel):
        code = (f"namespace {kernel.name} {{ int64_t workspace_size(const CoNormArgs&) {{ return 0; }}\n"
                f"int run(const CoNormArgs&, cudaStream_t) {{ return CO_OK; }} }}")
        return KernelSource(name=kernel.name, includes=(), code=code, args_type="CoNormArgs")


class ToyModule(RegionModule):
    @staticmethod
    def operand_nodes(region):
        return (("x", region.x),)

    def __init__(self, region, kernel, fallback, roles, library_getter):
        super().__init__(region, kernel, fallback, library_getter)


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.neg(x) * 3


def test_a_toy_kind_is_its_code_plus_one_row_per_table(monkeypatch):
    row = patterns.Anchor("toy_neg", aten.neg.default, toy_operands, make_toy)
    monkeypatch.setitem(patterns.ANCHOR_BY_TARGET, aten.neg.default, row)
    monkeypatch.setitem(select.CHOOSERS, ToyRegion, lambda r, arch, *_: (r, ToyKernel(arch, r.problem.dtype)))
    monkeypatch.setitem(emit._EMITTERS, ("toy_neg", "rowwise_norm"), ToyEmitter)
    monkeypatch.setitem(compiled_model.MODULES, ToyRegion, ToyModule)

    x = torch.randn(4, 8, dtype=torch.float16)
    gm = capture(Model(), (x,)).graph_module
    part = partition(gm, CompileOptions(arch="sm90a"))
    assert [r.form for r in part.regions] == ["toy_neg"]
    plan = select.select(part, "sm90a")
    assert [k.name for k in plan.kernels] == ["toy_neg_f16"]
    report = Report.from_plan(plan)
    assert report.regions[0]["toy"] == {"dtype": "f16"} and "toy_neg:plain x1" in report.format()
    unit = emit.emit_library(plan)
    assert "namespace toy_neg_f16" in unit.text and "co_region0_toy_neg" in unit.text
    out = offload(gm, plan, None)
    (mod,) = [m for m in out.modules() if isinstance(m, ToyModule)]
    assert mod.region.name == "region0_toy_neg"
    assert torch.equal(mod.fallback(x), -x)          # the region's PyTorch subgraph, kept


def test_plan_pairs_each_region_with_its_kernel():
    """Plan's regions and kernels are the two columns of its (region, kernel) pairs:
    equal lengths are checked; ``keep`` drops pairs into fallbacks with a reason."""
    from types import SimpleNamespace

    import pytest

    from cutlass_offload.ir import Fallback, Plan
    regions = tuple(SimpleNamespace(name=f"r{i}", nodes=(f"n{i}",), form="linear") for i in range(3))
    kernels = tuple(SimpleNamespace(name=f"k{i % 2}") for i in range(3))
    plan = Plan.from_pairs("sm90a", zip(regions, kernels), (Fallback("x", "mm", "why"),))
    assert plan.pairs == tuple(zip(regions, kernels)) and plan.regions == regions
    kept = plan.keep(lambda r, k: k.name != "k1", lambda r, k: f"{k.name} failed")
    assert [r.name for r in kept.regions] == ["r0", "r2"] and [k.name for k in kept.kernels] == ["k0", "k0"]
    assert kept.fallbacks == (Fallback("x", "mm", "why"), Fallback("n1", "linear", "k1 failed"))
    with pytest.raises(ValueError, match="pairs each region"):
        Plan("sm90a", regions, kernels[:2], ())
