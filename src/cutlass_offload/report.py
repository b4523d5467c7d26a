"""The compile report: what was offloaded, what fell back and why, kernels, times."""
from __future__ import annotations

import collections
import re
from dataclasses import asdict, dataclass, field

from .ir import Plan
from .target import TARGETS


def _shape(problem) -> dict:
    return problem.summary()


def arch_name(arch: str) -> str:
    """The target as the user types it: "sm80" -> "sm_80", "sm90a" -> "sm_90a"."""
    t = TARGETS.get(arch)
    return t.name if t is not None else re.sub(r"^sm_?", "sm_", arch)


def _flop_text(flops: float, digits: int) -> str:
    """GFLOP with ``digits`` decimals, or MFLOP below 0.1 GFLOP (a toy model's conv
    would read "0.0 GFLOP")."""
    if flops < 1e8:
        return f"{flops / 1e6:,.{digits}f} MFLOP"
    return f"{flops / 1e9:,.{digits}f} GFLOP"


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _form(region: dict) -> str:
    """A region's op as the summary line names it: a conv with channel groups says
    which kind ("conv2d[depthwise]", "conv2d[grouped]")."""
    conv = region.get("conv") or {}
    groups = conv.get("groups", 1)
    if groups == 1:
        return region["form"]
    kind = "depthwise" if groups == conv.get("c") == conv.get("k") else "grouped"
    return f"{region['form']}[{kind}]"


def _fallback_lines(fallbacks: list) -> list:
    """One line per reason: equal (op, reason) pairs count together (a 12-layer model's
    25 norms left to the glue are one line), named by module path where known; the
    ones refused come before the ones left by choice."""
    groups = collections.defaultdict(list)
    for f in fallbacks:
        groups[(bool(f.get("by_choice")), f["op"], f["reason"])].append(f)
    lines = []
    for (_, op, reason), fs in sorted(groups.items(), key=lambda kv: kv[0][0]):
        names = [f"{f['node']} at {f['module']}" if f.get("module") else f["node"] for f in fs]
        which = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        work = sum(f.get("flops", 0) for f in fs)
        work = f", {_flop_text(work, 2)}" if work else ""
        count = f" x{len(fs)}" if len(fs) > 1 else ""
        lines.append(f"  fallback {op}{count} ({which}{work}): {reason}")
    return lines


def _fallback_flops(f, flops: dict) -> dict:
    """{"flops": ...} of a fallback: its node's, or the sum over a refused region's nodes
    (a hand-written attention's FLOPs are on its two matmuls, not on the op it names)."""
    names = f.nodes or (f.node,)
    if not any(n in flops for n in names):
        return {}
    return {"flops": sum(flops.get(n, 0) for n in names)}


def _flop_share(plan: Plan, flops: dict) -> dict:
    offloaded = sum(flops.get(n, 0) for r in plan.regions for n in r.nodes)
    share = {"total": sum(flops.values()), "offloaded": offloaded}
    if getattr(flops, "data_dependent", None):       # partition.flops.FlopCounts
        share["data_dependent_ops"] = len(flops.data_dependent)
    return share


@dataclass
class Report:
    arch: str
    regions: list = field(default_factory=list)      # dicts: name, form, nodes, kernel, notes, note_summaries
    fallbacks: list = field(default_factory=list)    # dicts: node, op, reason (, flops)
    kernels: list = field(default_factory=list)      # dicts: name, family, regions
    phases: dict = field(default_factory=dict)       # phase -> seconds
    build: dict = field(default_factory=dict)
    tuning: dict = field(default_factory=dict)       # tune.TuningReport.to_dict() of a --tune compile
    glue: dict = field(default_factory=dict)         # glue, mode, options, how it was compiled
    flops: dict = field(default_factory=dict)        # total / offloaded FLOPs (partition/flops.py)
    inputs: dict = field(default_factory=dict)       # graph_utils.input_summary: shapes, dynamic sizes

    @classmethod
    def from_plan(cls, plan: Plan, flops: dict | None = None, modules: dict | None = None,
                  inputs: dict | None = None) -> "Report":
        """The report of ``plan``; ``flops``: {node name: FLOPs} of the partitioned
        graph's matmul / conv / attention ops (partition.flops.node_flops), summed into
        ``total`` and ``offloaded`` (those of the regions' nodes); ``modules``: {node
        name: module path} (graph_utils.module_paths), which a fallback's entry names;
        ``inputs``: graph_utils.input_summary of the captured graph."""
        users = collections.defaultdict(list)
        for r, k in plan.pairs:
            users[k.name].append(r.name)
        return cls(
            arch=plan.arch,
            regions=[{"name": r.name, "form": r.form, "nodes": list(r.nodes), "kernel": k.name,
                      "epilogue": r.problem.epilogue.tag, **_shape(r.problem),
                      "notes": [str(n) for n in r.notes],
                      "note_summaries": [getattr(n, "summary", str(n)) for n in r.notes]}
                     for r, k in plan.pairs],
            fallbacks=[{**{k: v for k, v in asdict(f).items() if k != "nodes"},
                        **_fallback_flops(f, flops or {}),
                        **({"module": modules[f.node]} if f.node in (modules or {}) else {})}
                       for f in plan.fallbacks],
            kernels=[{"name": k.name, "family": k.config.family, "regions": users[k.name]}
                     for k in plan.distinct_kernels],
            flops=_flop_share(plan, flops) if flops else {}, inputs=inputs or {})

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.format()

    def _repr_pretty_(self, p, cycle) -> None:       # IPython / Jupyter show the readable form
        p.text(self.format())

    def format(self) -> str:
        """The report as a person reads it (``str(report)`` / ``print(report)``)."""
        chosen = sum(1 for f in self.fallbacks if f.get("by_choice"))
        out = [f"target {arch_name(self.arch)}: {_n(len(self.regions), 'region')} offloaded, "
               f"{_n(len(self.fallbacks), 'offloadable op')} left in PyTorch"
               + (f" ({chosen} by choice)" if chosen else "")
               + f", {_n(len(self.kernels), 'distinct kernel')}"]
        if self.flops.get("total"):
            f = self.flops
            out.append(f"work offloaded: {100 * f['offloaded'] / f['total']:.1f}% of the "
                       f"{_flop_text(f['total'], 1)} of matmul / conv / attention ops "
                       + ("(at the example inputs)" if not self.inputs.get("traced_batch")
                          else f"(at the traced inputs: batch {self.inputs['traced_batch']})")
                       + (f"; a lower bound: {_n(f['data_dependent_ops'], 'op')} with a size known "
                          "only at run time (counted as 1)" if f.get("data_dependent_ops") else ""))
        by_form = collections.Counter(_form(r) + ":" + r["epilogue"] for r in self.regions)
        if by_form:
            out.append("offloaded (op:epilogue x count): " +
                       ", ".join(f"{k} x{v}" for k, v in sorted(by_form.items())))
        if not self.regions and self.fallbacks:
            out.append("nothing offloaded: every op below stays in PyTorch, for the reason beside it")
        out += _fallback_lines(self.fallbacks)
        # equal notes of different regions count together: their summaries (ir.Note)
        # leave the node names out; a report saved before summaries shows its texts
        notes = collections.Counter(n for r in self.regions for n in r.get("note_summaries", r["notes"]))
        for note, count in notes.most_common():
            names = [r["name"] for r in self.regions if note in r.get("note_summaries", r["notes"])]
            which = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            out.append(f"  {_n(count, 'region')} ({which}): {note}")
        out.append("kernels:")
        for k in self.kernels:
            n = len(k["regions"])
            out.append(f"  {k['name']}  ({n} region{'s' if n != 1 else ''})")
        if self.inputs.get("inputs"):
            out.append(_inputs_line(self.inputs))
        if self.glue:
            g = self.glue
            line = f"glue: {g.get('glue')}"
            if g.get("mode"):
                line += f" (mode {g['mode']})"
            if g.get("requested") and g.get("requested") != g.get("glue"):
                line += f", from {g['requested']!r}"
            if g.get("note"):
                line += f"; {g['note']}"
            out.append(line)
        if self.phases:
            out.append("phases: " + ", ".join(f"{p} {s:.2f} s" for p, s in self.phases.items()))
        if self.build:
            b = self.build
            compiled = [u for u in b.get("units", []) if not u["cache_hit"]]
            if b.get("staged_epilogue"):
                store = "TMA stores" if b["staged_epilogue"] == "tma" else "16-byte row stores"
                out.append(f"epilogues: staged in shared memory, {store} (CUTLASS_OFFLOAD_STAGED_EPILOGUE; "
                           "experimental: correct, but its GEMMs ran at 0.83-0.87x the default's speed on an H100)")
            out.append(f"build ({b['strategy']}, {_n(b['jobs'], 'job')}): {b['seconds']:.1f} s wall, "
                       f"{len(compiled)} of {_n(len(b.get('units', [])), 'unit')} compiled, critical path "
                       f"{b['critical_path_seconds']:.1f} s, link {b['link_seconds']:.1f} s")
            for u in sorted(compiled, key=lambda u: -u["seconds"]):
                out.append(f"  {u['name']:<32} {_n(len(u['kernels']), 'kernel'):>11} {u['seconds']:>7.1f} s "
                           f"{u['peak_rss_mb']:>7.0f} MB peak  {'ok' if u['ok'] else 'FAILED'}"
                           + (f"  [{u['executor']}]" if u.get("executor", "local") != "local" else ""))
            for f in b.get("failures", []):
                out.append(f"  kernel failed to compile: {f['kernel']} (log: {f['log']})")
            out.append(f"  library: {b['library']} (the build cache's copy; a saved folder holds its own)")
        if self.tuning:
            from .tune.result import format_tuning
            out.append(format_tuning(self.tuning))
        return "\n".join(out)


def _inputs_line(summary: dict) -> str:
    """"inputs: ids (s0, 512) int64; dynamic: 2 <= s0", or "...; every size static"."""
    shown = [f"{i['name']} ({', '.join(map(str, i['shape']))}{',' if len(i['shape']) == 1 else ''}) {i['dtype']}"
             for i in summary["inputs"][:4]]
    more = len(summary["inputs"]) - len(shown)
    line = "inputs: " + ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    dyn = summary.get("dynamic") or {}
    if not dyn:
        return line + ("; every size static: calls with other sizes are refused "
                       "(--dynamic-batch / dynamic_batch=True makes dim 0 dynamic)")
    ranges = [f"{lo if lo is not None else '?'} <= {s}" + (f" <= {hi}" if hi is not None else "")
              for s, (lo, hi) in dyn.items()]
    line += "; dynamic: " + ", ".join(ranges)
    if summary.get("traced_batch"):
        line += (f"; traced at batch {summary['traced_batch']} (the example's batch of 1 doubled: "
                 "torch.export specializes a size-1 dim), so the FLOPs above and the kernels' "
                 "choices are batch 2's")
    return line
