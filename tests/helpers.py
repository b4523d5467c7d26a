"""Shared test helpers: tolerances, relative error, allocator poisoning."""
import torch

# Norm-wise relative error tolerated against a float32 reference, by input dtype.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-3}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def poison_allocator(device="cuda", mb=256):
    """Fill the caching allocator's free blocks with NaN so an output the kernel
    never writes shows up as NaN instead of stale data."""
    blocks = [torch.full((n,), float("nan"), dtype=torch.float16, device=device)
              for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22, mb << 19)]
    del blocks


class Fn(torch.nn.Module):
    """A module that calls ``fn`` on its inputs (to capture a function as a model)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def recorded_calls(gm, mods, *input_sets):
    """{region name: [its inputs in each forward of ``gm``]} for the region modules
    ``mods`` ({name: module}) of an offloaded graph, each forward run without a GPU
    (the regions run their PyTorch fallback)."""
    seen = {n: [] for n in mods}

    def recording(name, m):
        def forward(*xs):
            seen[name].append(xs)
            return m.fallback(*xs)
        return forward
    for name, m in mods.items():
        m.forward = recording(name, m)
    with torch.no_grad():
        for xs in input_sets:
            gm(*xs)
    for m in mods.values():
        del m.forward
    return seen
