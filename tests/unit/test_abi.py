"""The C ABI module (abi.py) against emit/templates/prelude.h, read as text (no
compiler): every struct's fields in order with their C types, the status codes,
and the ctypes mirrors built from it. tests/build/test_abi_layout.py checks the
offsets a compiler gives them."""
import re

import pytest

from cutlass_offload import abi
from cutlass_offload.emit import TEMPLATES
from cutlass_offload.runtime.library import ARGS_TYPES

KINDS = {"const void*": "ptr", "void*": "ptr", "int64_t": "i64", "float": "f32", "int32_t": "i32"}
PRELUDE = (TEMPLATES / "prelude.h").read_text()


def _struct_fields(name: str) -> tuple:
    body = re.search(rf"struct {name} \{{(.*?)\}};", PRELUDE, re.DOTALL).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    fields = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        m = re.match(r"(const void\*|void\*|int64_t|float|int32_t)\s+(.*)", decl, re.DOTALL)
        assert m, f"{name}: unexpected declaration {decl!r}"
        fields += [(n.strip(), KINDS[m.group(1)]) for n in m.group(2).split(",")]
    return tuple(fields)


@pytest.mark.parametrize("name", sorted(abi.ARGS_FIELDS))
def test_args_fields_match_prelude_h(name):
    assert _struct_fields(name) == abi.ARGS_FIELDS[name]
    assert [f for f, _ in ARGS_TYPES[name]._fields_] == [f for f, _ in abi.ARGS_FIELDS[name]]


def test_every_prelude_struct_is_in_the_abi():
    assert set(re.findall(r"^struct (Co\w+Args) \{", PRELUDE, re.MULTILINE)) == set(abi.ARGS_FIELDS)


def test_status_codes_match_prelude_h():
    enum = re.search(r"enum CoStatus : int \{(.*?)\};", PRELUDE, re.DOTALL).group(1)
    codes = {k: int(v) for k, v in re.findall(r"(CO_\w+) = (\d+)", enum)}
    assert codes == {"CO_OK": abi.CO_OK, "CO_CANNOT_IMPLEMENT": abi.CO_CANNOT_IMPLEMENT,
                     "CO_WORKSPACE_TOO_SMALL": abi.CO_WORKSPACE_TOO_SMALL,
                     "CO_INIT_FAILED": abi.CO_INIT_FAILED, "CO_LAUNCH_FAILED": abi.CO_LAUNCH_FAILED}
    assert set(abi.STATUS_NAMES) == set(codes.values())


def test_symbols():
    assert abi.region_symbol("region3_linear_bias") == "co_region3_linear_bias"
    assert abi.workspace_symbol("r") == "co_r_workspace"
