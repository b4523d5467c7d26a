"""The Inductor options our C++-wrapper choice passes (glue.compile_options on CUDA:
cpp_wrapper with CPP_WRAPPER_EXTRA_OPTIONS) are accepted by the installed torch and
compile a graph whose wrapper entry is built at -O0 (the options' level), with the
same results as eager.
Run on the CPU (the host compiler is what the options change), with a fresh Inductor
cache so the compile really runs."""
import torch
import torch.fx as fx

from cutlass_offload.runtime import glue


class Glue(torch.nn.Module):
    def forward(self, x, y):
        return torch.sin(x) * 2 + y.relu()


def test_cpp_wrapper_options_compile_at_their_level(tmp_path, monkeypatch):
    from torch._inductor import cpp_builder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    levels = []
    real = cpp_builder.CppBuilder.build

    def build(self, *a, **k):
        cmd = self.get_command_line()
        if ".main.cpp" in cmd and " -E " not in cmd:
            levels.append([f for f in cmd.split() if f.startswith("-O")][-1])
        return real(self, *a, **k)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", build)
    options = {"cpp_wrapper": True, **glue.CPP_WRAPPER_EXTRA_OPTIONS}
    torch._dynamo.reset()
    fn = torch.compile(fx.symbolic_trace(Glue()), backend="inductor", options=options)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        out = fn(x, y)
    torch._dynamo.reset()
    assert torch.allclose(out, Glue()(x, y), atol=1e-6)
    want = "-" + glue.CPP_WRAPPER_EXTRA_OPTIONS["aot_inductor.compile_wrapper_opt_level"]
    assert levels and set(levels) == {want}, levels
