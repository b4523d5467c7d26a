"""The build cache's kernel index (build/__init__.py ``_unit_serves``): a cached unit
is linked in place of a kernel only when every kernel of the plan it holds was
compiled there from the code it has now. Kernel names are not content hashes: when
an emitter changes a kernel's code under the same name, the unit holding the old
code must not serve it (nor its unit neighbours: two objects holding one symbol fail
the link). Fake nvcc (tests/fake_nvcc.py), no CUDA."""
import dataclasses

import cutlass_offload as co
import cutlass_offload.build as build_stage
from fault_helpers import fake_env, small_model


def _compile():
    model, inputs = small_model()
    compiled = co.compile(model, inputs, arch="sm_80", glue="eager")
    units = compiled.report.build["units"]
    return compiled, units, [u for u in units if not u["cache_hit"] and u["name"] != "launchers"]


def test_a_kernel_whose_code_changed_is_compiled_again(tmp_path, monkeypatch):
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    compiled, _, fresh = _compile()
    names = sorted(k.name for k in compiled.plan.kernels)
    assert len(names) == 2 and [sorted(u["kernels"]) for u in fresh] == [names]    # one shard
    _, units, fresh = _compile()
    assert fresh == [] and any(u["cache_hit"] and sorted(u["kernels"]) == names for u in units)

    changed = next(n for n in names if "relu" in n)
    real = build_stage.emit_kernels

    def emit_changed(plan):            # as an emitter change would: same name, new code
        src = real(plan)
        return {n: dataclasses.replace(s, code=s.code + "\n// changed\n") if n == changed else s
                for n, s in src.items()}
    monkeypatch.setattr(build_stage, "emit_kernels", emit_changed)
    _, units, fresh = _compile()
    assert any(changed in u["kernels"] for u in fresh), units
    assert not any(changed in u["kernels"] for u in units if u["cache_hit"]), units
    # and the unit just compiled serves the changed code the next time
    _, units, fresh = _compile()
    assert fresh == [], units


def test_a_kernel_whose_preamble_changed_is_compiled_again(tmp_path, monkeypatch):
    """A preamble block (e.g. our activation functors, emit/templates/activations.h)
    is code the kernel compiles against: a change to it is a change to the kernel."""
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    compiled, _, _ = _compile()
    changed = next(k.name for k in compiled.plan.kernels if "relu" in k.name)
    real = build_stage.emit_kernels

    def emit_changed(plan):
        src = real(plan)
        return {n: dataclasses.replace(s, preamble=s.preamble + ("// a functor rewritten\n",))
                if n == changed else s for n, s in src.items()}
    monkeypatch.setattr(build_stage, "emit_kernels", emit_changed)
    _, units, fresh = _compile()
    assert any(changed in u["kernels"] for u in fresh), units
