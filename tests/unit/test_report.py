"""The report a person reads (issue 20): str(report), the target as typed, plurals,
notes in words."""
from cutlass_offload.report import Report, _note_kind


def _report(**kw):
    base = dict(arch="sm80",
                regions=[{"name": "region0_sdpa", "form": "sdpa", "epilogue": "none",
                          "notes": ["attn_mask mask_1 folded: top_left"]}],
                kernels=[{"name": "k0", "family": "cutlass2x_sm80", "regions": ["region0_sdpa"]}])
    base.update(kw)
    return Report(**base)


def test_str_is_the_readable_report():
    rep = _report()
    assert str(rep) == rep.format() and not str(rep).startswith("Report(")
    first = str(rep).splitlines()[0]
    assert first == ("target sm_80: 1 region offloaded, 0 offloadable ops left in PyTorch, "
                     "1 distinct kernel")
    assert "  1 region: causal mask folded into the kernel (top-left aligned)" in str(rep)
    assert "x1:" not in str(rep)


def test_counts_and_targets_read_as_typed():
    rep = _report(arch="sm90a", regions=_report().regions * 12,
                  fallbacks=[{"node": "n", "op": "aten.mm", "reason": "r"}] * 2)
    text = str(rep)
    assert text.startswith("target sm_90a: 12 regions offloaded, 2 offloadable ops left in PyTorch")
    assert "  12 regions: causal mask folded" in text


def test_notes_keep_their_meaning_without_node_names():
    assert _note_kind("mask where_3 folded: bottom_right (checked once per shape)") == \
        "causal mask folded into the kernel (bottom-right aligned) (checked once per shape)"
    assert _note_kind("norm stops at add_7: used 3 times") == \
        "norm ends at an output used 3 times (kept in the region)"
    assert _note_kind("negative scale -0.125: runs as 0.125 on -q (or -k)") == \
        "negative scale -0.125: runs as 0.125 on -q (or -k)"
