"""The report a person reads (issue 20): str(report), the target as typed, plurals,
notes in words."""
from cutlass_offload.ir import Note, note_mask_folded, note_not_fused, note_stops
from cutlass_offload.report import Report


def _report(**kw):
    base = dict(arch="sm80",
                regions=[{"name": "region0_sdpa", "form": "sdpa", "epilogue": "none",
                          "notes": ["attn_mask mask_1 folded: top_left"],
                          "note_summaries": [note_mask_folded("attn_mask", "mask_1", "top_left",
                                                              False).summary]}],
                kernels=[{"name": "k0", "family": "cutlass2x_sm80", "regions": ["region0_sdpa"]}])
    base.update(kw)
    return Report(**base)


def test_str_is_the_readable_report():
    rep = _report()
    assert str(rep) == rep.format() and not str(rep).startswith("Report(")
    first = str(rep).splitlines()[0]
    assert first == ("target sm_80: 1 region offloaded, 0 offloadable ops left in PyTorch, "
                     "1 distinct kernel")
    assert "  1 region (region0_sdpa): causal mask folded into the kernel (top-left aligned)" in str(rep)
    assert "x1:" not in str(rep)


def test_counts_and_targets_read_as_typed():
    rep = _report(arch="sm90a", regions=_report().regions * 12,
                  fallbacks=[{"node": "n", "op": "aten.mm", "reason": "r"}] * 2)
    text = str(rep)
    assert text.startswith("target sm_90a: 12 regions offloaded, 2 offloadable ops left in PyTorch")
    assert "  12 regions (region0_sdpa, region0_sdpa, region0_sdpa and 9 more): causal mask folded" in text


def test_notes_keep_their_meaning_without_node_names():
    dropped = note_mask_folded("attn_mask", "mask", "none", False)
    assert dropped.summary == ("mask hides nothing (a bias of zeros, a mask of all true, at the "
                               "values compiled): dropped")
    folded = note_mask_folded("mask", "where_3", "bottom_right", True)
    assert folded == "mask where_3 folded: bottom_right (checked once per shape)"
    assert folded.summary == \
        "causal mask folded into the kernel (bottom-right aligned) (checked once per shape)"
    assert note_stops("norm", "add_7", 3).summary == (
        "norm ends at an output with more than one user (a residual stream, a concatenation): "
        "it is written to memory for them, so nothing after it fuses")
    # one line for every count of users (DenseNet's 2..24, fresh-user trial, session 55)
    assert note_stops("epilogue", "a", 2).summary == note_stops("epilogue", "b", 24).summary
    assert note_not_fused("gelu_2", "used twice").summary == \
        "next op not fused into the epilogue (stays in PyTorch): used twice"
    plain = Note("negative scale -0.125: runs as 0.125 on -q (or -k)")
    assert plain.summary == plain


def test_a_report_saved_before_summaries_shows_its_note_texts():
    rep = Report(arch="sm80", regions=[{"name": "r", "form": "sdpa", "epilogue": "none",
                                        "notes": ["attn_mask mask_1 folded: top_left"]}])
    assert "  1 region (r): attn_mask mask_1 folded: top_left" in str(rep)


def test_a_build_with_the_staged_epilogues_says_so(monkeypatch):
    # $CUTLASS_OFFLOAD_STAGED_EPILOGUE changes the kernels a build emits: the report (and
    # a saved folder's report.json) names the form
    from cutlass_offload import api
    from cutlass_offload.ir import Plan
    build = {"strategy": "sharded", "jobs": 2, "seconds": 1.0, "critical_path_seconds": 1.0,
             "link_seconds": 0.1, "units": [], "library": "lib.so"}
    plain = str(_report(arch="sm90a", build=build))
    assert "epilogues:" not in plain
    text = str(_report(arch="sm90a", build={**build, "staged_epilogue": "tma"}))
    assert "epilogues: staged in shared memory, TMA stores (CUTLASS_OFFLOAD_STAGED_EPILOGUE" in text
    plan = Plan("sm90a", ("r",), ("k",), ())
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "rows")
    assert api._epilogue_forms(plan) == {"staged_epilogue": "rows"}
    assert api._epilogue_forms(Plan("sm80", ("r",), ("k",), ())) == {}
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "0")
    assert api._epilogue_forms(plan) == {}


def test_fallbacks_count_together_by_reason_with_module_paths():
    """A deep model's norms left to the glue are one line, not one per norm, counted
    apart from the refusals, which come first; each names where it is in the model
    (fresh-user trial, session 54)."""
    from cutlass_offload.ir import Fallback, Plan
    choice = "left to the glue by choice: Inductor fuses a norm with its neighbours"
    fallbacks = tuple(Fallback(f"layer_norm_{i}", "layer_norm", choice, by_choice=True) for i in range(25))
    fallbacks += (Fallback("baddbmm", "baddbmm", "no anchor for baddbmm"),)
    modules = {f"layer_norm_{i}": f"encoder.layer.{i // 2}.ln (LayerNorm)" for i in range(25)}
    modules["baddbmm"] = "blocks.3.attn (Attention)"
    rep = Report.from_plan(Plan(arch="sm90a", regions=(), kernels=(), fallbacks=fallbacks),
                           {"baddbmm": 16.8e6}, modules)
    lines = str(rep).splitlines()
    assert lines[0] == ("target sm_90a: 0 regions offloaded, 26 offloadable ops left in PyTorch "
                        "(25 by choice), 0 distinct kernels")
    fb = [ln for ln in lines if ln.startswith("  fallback ")]
    assert fb == [
        "  fallback baddbmm (baddbmm at blocks.3.attn (Attention), 16.80 MFLOP): no anchor for baddbmm",
        "  fallback layer_norm x25 (layer_norm_0 at encoder.layer.0.ln (LayerNorm), layer_norm_1 at "
        "encoder.layer.0.ln (LayerNorm), layer_norm_2 at encoder.layer.1.ln (LayerNorm) and 22 more): "
        + choice]
    assert rep.to_dict()["fallbacks"][-1]["module"] == "blocks.3.attn (Attention)"
