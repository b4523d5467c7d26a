"""partition/flops.py: the FLOPs of matmul / conv / attention ops at the example
sizes (checked against torch.utils.flop_counter on the same ops), and the report's
share of them offloaded, with the FLOPs of each op left in PyTorch."""
import types

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from cutlass_offload.capture import capture
from cutlass_offload.ir import Fallback, Plan
from cutlass_offload.partition.flops import node_flops
from cutlass_offload import report as report_module
from cutlass_offload.report import Report


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(48, 40)
        self.conv = torch.nn.Conv2d(8, 16, (3, 5), padding=1)
        self.grouped = torch.nn.Conv2d(16, 32, 3, groups=4)
        self.conv1d = torch.nn.Conv1d(6, 10, 7, stride=2)

    def forward(self, x, img, q, k, v, a, b, seq):
        y = self.lin(x)
        z = self.grouped(self.conv(img))
        att = F.scaled_dot_product_attention(q, k, v)
        return y, z, att, torch.bmm(a, b), a @ b, self.conv1d(seq)


def _inputs():
    return (torch.randn(5, 7, 48), torch.randn(2, 8, 12, 14), torch.randn(2, 3, 9, 16),
            torch.randn(2, 3, 11, 16), torch.randn(2, 3, 11, 24), torch.randn(4, 6, 5),
            torch.randn(4, 5, 3), torch.randn(3, 6, 40))


def test_flops_match_torch_flop_counter():
    m, xs = Mixed().eval(), _inputs()
    counts = node_flops(capture(m, xs).graph_module)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(*xs)
    assert sum(counts.values()) == fc.get_total_flops() > 0
    assert len(counts) == 7                    # linear, 3 convs, sdpa, bmm, matmul


def test_transposed_convs_count_like_torch_flop_counter():
    """A transposed conv stays in PyTorch (partition/unanchored.py); its FLOPs must still
    enter the share's denominator (a fresh-user trial, session 50, read 98.5% offloaded
    with one left out)."""
    class Up(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up2 = torch.nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1, groups=2)
            self.up1 = torch.nn.ConvTranspose1d(5, 3, 3, stride=2)

        def forward(self, img, seq):
            return self.up2(img), self.up1(seq)
    m, xs = Up().eval(), (torch.randn(2, 8, 5, 7), torch.randn(3, 5, 11))
    counts = node_flops(capture(m, xs).graph_module)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(*xs)
    assert len(counts) == 2 and sum(counts.values()) == fc.get_total_flops() > 0


def test_sdpa_backend_ops_count_like_sdpa():
    """Below SDPA's dispatch (AOTAutograd's graphs) the backend op returns a tuple;
    its first output is the attention's."""
    q, k, v = torch.randn(2, 3, 9, 16), torch.randn(2, 3, 11, 16), torch.randn(2, 3, 11, 16)
    g = torch.fx.Graph()
    args = [g.placeholder(n) for n in "qkv"]
    for a, t in zip(args, (q, k, v)):
        a.meta["val"] = t
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    node = g.call_function(op, tuple(args))
    node.meta["val"] = op(q, k, v)
    g.output(node)
    counts = node_flops(torch.fx.GraphModule(torch.nn.Module(), g))
    assert counts == {node.name: 2 * 2 * 3 * 9 * 11 * (16 + 16)}


def test_symbolic_sizes_count_at_their_example_value():
    m, xs = Mixed().eval(), _inputs()
    static = sum(node_flops(capture(m, xs).graph_module).values())
    dyn = {"x": {0: torch.export.Dim("b", min=2)}}
    gm = torch.export.export(m, xs, dynamic_shapes={**{k: None for k in (
        "img", "q", "k", "v", "a", "b", "seq")}, **dyn}).module()
    assert sum(node_flops(gm).values()) == static


class _Region:
    def __init__(self, nodes):
        self.nodes = nodes


def test_report_gives_the_share_offloaded_and_each_fallbacks_flops():
    plan = Plan.from_pairs("sm90a", [], (Fallback("conv2d", "conv2d", "PyTorch is faster here"),))
    report = Report.from_plan(plan, {"linear": 3_000_000_000, "conv2d": 1_000_000_000})
    assert report.flops == {"total": 4_000_000_000, "offloaded": 0}
    text = report.format()
    assert "work offloaded: 0.0% of the 4.0 GFLOP" in text
    assert "fallback conv2d (conv2d, 1.00 GFLOP): PyTorch is faster here" in text
    assert "work offloaded" not in Report.from_plan(plan).format()      # no counts: no line
    # the regions' nodes are what counts as offloaded (an epilogue node adds nothing)
    regions = types.SimpleNamespace(regions=[_Region(["linear", "relu"])])
    assert report_module._flop_share(regions, {"linear": 3, "conv2d": 1}) == {"total": 4, "offloaded": 3}


def test_a_toy_models_work_reads_in_mflop():
    plan = Plan.from_pairs("sm90a", [], (Fallback("conv2d", "conv2d", "no kernel"),))
    text = Report.from_plan(plan, {"linear": 3_000_000, "conv2d": 6_000_000}).format()
    assert "work offloaded: 0.0% of the 9.0 MFLOP" in text
    assert "fallback conv2d (conv2d, 6.00 MFLOP): no kernel" in text


def test_einsum_mv_and_dot_count_like_torch_flop_counter():
    """einsum (kept whole by torch.export), mv and dot stay in PyTorch; their FLOPs must
    enter the share's denominator (a fresh-user trial, session 53, read 100% offloaded
    with two attention einsums left out)."""
    class Ein(torch.nn.Module):
        def forward(self, q, k, x, w, m, vec):
            s = torch.einsum("bhqd,bhkd->bhqk", q, k)
            o = torch.einsum("bhqk,bhkd->bhqd", s, k)
            bc = torch.einsum("...ij,jk->...ik", x, w)       # ellipsis, broadcast
            implicit = torch.einsum("ij,jk", m, w)           # output "ik" implied
            return s, o, bc, implicit, torch.mv(m, vec), torch.dot(vec, vec)
    xs = (torch.randn(2, 3, 9, 16), torch.randn(2, 3, 11, 16), torch.randn(4, 5, 6, 7),
          torch.randn(7, 8), torch.randn(10, 7), torch.randn(7))
    m = Ein().eval()
    # the exported graph as it is (capture's canonicalization lowers two-operand einsums
    # with static sizes to bmm: partition/einsum.py); a dynamic one stays an einsum
    counts = node_flops(torch.export.export(m, xs).module())
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(*xs)
    # torch's counter has no rule for mv and dot: 2 * M * K and 2 * K here
    assert counts["mv"] == 2 * 10 * 7 and counts["dot"] == 2 * 7
    assert sum(counts.values()) - counts["mv"] - counts["dot"] == fc.get_total_flops() > 0
    assert len(counts) == 6
    ein = sorted(v for k, v in counts.items() if k.startswith("einsum"))
    assert ein == sorted([2 * 2 * 3 * 9 * 11 * 16] * 2 + [2 * 4 * 5 * 6 * 7 * 8, 2 * 10 * 7 * 8])


def test_einsum_of_three_operands_counts_each_contraction():
    class Chain(torch.nn.Module):
        def forward(self, a, b, c):
            return torch.einsum("ij,jk,kl->il", a, b, c), torch.einsum("ij->i", a)
    xs = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 6))
    counts = node_flops(capture(Chain().eval(), xs).graph_module)
    # (ij,jk -> ik: 2*3*4*5) then (ik,kl -> il: 2*3*5*6); one operand (a sum) counts 0
    assert sorted(counts.values()) == [0, 2 * 3 * 4 * 5 + 2 * 3 * 5 * 6]


def test_a_size_known_only_at_run_time_makes_the_share_a_lower_bound():
    """torch.where routing (a hand-written mixture of experts) sizes each expert's rows
    at run time: counted as 1 row, the report says the figure is a lower bound
    (fresh-user trial, session 54)."""
    import cutlass_offload as co

    class Routed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.expert = torch.nn.Linear(32, 64)

        def forward(self, x):
            rows = torch.where(x[:, 0] > 0)[0]
            return self.expert(x[rows]), x @ x.t()
    x = torch.randn(16, 32).half()
    gm = capture(Routed().half(), (x,)).graph_module
    counts = node_flops(gm)
    assert len(counts.data_dependent) == 1 and counts.data_dependent <= set(counts)
    rep = co.explain(Routed().half(), (x,), arch="sm_90a").report
    assert rep.flops["data_dependent_ops"] == 1
    assert "a lower bound: 1 op with a size known only at run time (counted as 1)" in str(rep)
    plain = co.explain(torch.nn.Linear(32, 64).half(), (x,), arch="sm_90a").report
    assert "data_dependent_ops" not in plain.flops and "lower bound" not in str(plain)
