"""The house rules of src/cutlass_offload (issue 18), checked on the source: which
stage may import which, no import cycle between the package's top-level modules and
subpackages, and no source file over 600 lines."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "cutlass_offload"
MAX_LINES = 600


def _imports():
    """{top-level unit: {top-level units it imports}} for every relative import
    (module level or inside functions); a unit is a subpackage or a module."""
    edges = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        me = rel.parts[0].removesuffix(".py")
        pkg = list(rel.parent.parts)
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            target = pkg[: len(pkg) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            names = [target[0]] if target else [a.name for a in node.names]
            edges.setdefault(me, set()).update(n for n in names if n != me)
    return edges


def _reaches(edges, a):
    seen, todo = set(), [a]
    while todo:
        for b in edges.get(todo.pop(), ()):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


@pytest.mark.parametrize("stage, forbidden", [
    ("select", {"emit", "partition", "runtime", "build"}),
    ("runtime", {"emit", "partition", "select", "build"}),
    ("families", {"emit", "select", "partition", "runtime", "build"}),
    ("abi", {"emit", "select", "partition", "runtime", "build"}),
    ("masks", {"emit", "select", "partition", "runtime", "build"}),
    ("target", {"emit", "select", "partition", "runtime", "build", "ir", "api"}),
    ("dtypes", {"emit", "select", "partition", "runtime", "build", "ir", "api", "families"}),
    ("ir", {"emit", "select", "partition", "runtime", "build", "families"}),
])
def test_stage_imports(stage, forbidden):
    assert not (_imports().get(stage, set()) & forbidden)


def test_no_import_cycle():
    edges = _imports()
    units = set(edges) | {u for v in edges.values() for u in v}
    cycles = sorted({tuple(sorted((a, b))) for a in units for b in units
                     if a < b and b in _reaches(edges, a) and a in _reaches(edges, b)})
    assert cycles == []


def test_no_source_file_over_600_lines():
    long = {str(f.relative_to(ROOT)): n for f in ROOT.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_one_row_per_region_kind():
    """select's choosers and the runtime's modules each have exactly one row per
    region kind of the IR."""
    from cutlass_offload import ir
    from cutlass_offload.runtime.compiled_model import MODULES
    from cutlass_offload.select import CHOOSERS

    kinds = {c for c in vars(ir).values()
             if isinstance(c, type) and issubclass(c, ir.common._Region) and c is not ir.common._Region}
    assert set(CHOOSERS) == kinds == set(MODULES)
    assert all(hasattr(MODULES[k], "operand_nodes") for k in kinds)


def test_targets_are_one_row_each():
    from cutlass_offload import target
    from cutlass_offload.api import resolve_arch
    from cutlass_offload.build.toolchain import GENCODE
    from cutlass_offload.ir import ARCHS
    from cutlass_offload.report import arch_name
    from cutlass_offload.select import DEFAULT_NUM_SMS

    assert set(GENCODE) == set(DEFAULT_NUM_SMS) == set(ARCHS) == set(target.TARGETS)
    assert resolve_arch("sm_90") == "sm90a" and resolve_arch("sm_80") == "sm80"
    # any 8.x GPU runs sm_80's SASS: its own name is taken for it; case does not matter
    assert resolve_arch("sm_86") == resolve_arch("SM_89") == resolve_arch("sm87") == "sm80"
    import pytest
    with pytest.raises(ValueError, match="any compute capability 8.x GPU"):
        resolve_arch("sm_75")
    assert arch_name("sm90a") == "sm_90a"
    assert target.for_capability((9, 0)) == "sm90a" and target.for_capability((8, 6)) == "sm80"
    assert target.for_capability((10, 0)) is None


def test_every_environment_knob_is_documented():
    """config.py is the one place that reads the environment: every variable it reads
    is in its docstring (what `cutlass-offload --help` prints) and in the README, and
    no other source file reads a variable (the CLI may set one; a subprocess may be
    handed the whole environment)."""
    import re

    from cutlass_offload import config
    src = Path(config.__file__).read_text()
    # env.get("X"), and the strict readers _flag(env, "X", ...) / _count(env, "X")
    read = set(re.findall(r'(?:env\.get\(|_flag\(env, |_count\(env, )"([A-Z_]+)"', src))
    assert read >= {"CUTLASS_OFFLOAD_CACHE_DIR", "CUTLASS_OFFLOAD_NVCC_STEPS"}, read
    readme = (Path(config.__file__).parents[2] / "README.md").read_text()
    for var in sorted(read - {"XDG_CACHE_HOME"}):
        assert var in config.__doc__, f"{var} is read but not in config.py's docstring"
        assert var in readme, f"{var} is read but not in the README"
    pkg = Path(config.__file__).parent
    others = [p.relative_to(pkg) for p in pkg.rglob("*.py")
              if p.name != "config.py"
              and re.search(r"os\.getenv\(|os\.environ\.get\(|os\.environ\[[^\]]+\](?!\s*=)", p.read_text())]
    assert others == [], others
