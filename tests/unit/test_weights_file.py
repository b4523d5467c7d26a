"""weights.py: an output folder's weights beside its program (no nvcc, no GPU).
The program saved with meta tensors plus weights.bin loads back to the same
tensors (values, dtypes, strides, shared storages, parameters); a damaged or
mismatched index is refused; chunked digests find the damaged chunk."""
import json
import os

import pytest
import torch

from cutlass_offload import integrity, weights
from cutlass_offload.errors import DamagedFileError
from cutlass_offload.folder import load_exported


class Tied(torch.nn.Module):
    """Tied and transposed weights, a buffer, a bf16 parameter, a lifted constant."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 20)
        self.b = torch.nn.Linear(20, 12)
        self.b.weight = torch.nn.Parameter(self.a.weight.t())   # a view of a's storage
        self.c = torch.nn.Parameter(torch.randn(3, 5, dtype=torch.bfloat16))
        self.register_buffer("scale", torch.rand(12) + 0.5)
        self.register_buffer("row", torch.randn(4, 12)[1])     # a view with an offset

    def forward(self, x):
        y = self.b(torch.relu(self.a(x))) * self.scale + self.row
        return y + self.c.float().sum() + torch.tensor([0.25, 0.5] * 6)


def _save(ep, folder):
    program, tensors = weights.split(ep)
    torch.export.save(program, str(folder / "model.pt2"))
    weights.write(tensors, folder)
    return tensors


def _load(folder):
    ep = load_exported(folder / "model.pt2")
    weights.attach(ep, folder)
    return ep


def test_round_trip_keeps_values_strides_ties_and_parameters(tmp_path):
    torch.manual_seed(0)
    ep = torch.export.export(Tied(), (torch.randn(2, 12),))
    tensors = _save(ep, tmp_path)
    assert len(tensors) == len([t for t in [*ep.state_dict.values(), *ep.constants.values()]
                                if isinstance(t, torch.Tensor)])
    # model.pt2 holds no tensor bytes: the weights are in weights.bin only
    torch.export.save(ep, str(tmp_path / "whole.pt2"))
    stored = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for _, _, t in tensors}.values())
    assert os.path.getsize(tmp_path / "model.pt2") <= os.path.getsize(tmp_path / "whole.pt2") - stored // 2
    back = _load(tmp_path)
    for table in ("state_dict", "constants"):
        old, new = getattr(ep, table), getattr(back, table)
        assert set(old) == set(new)
        for name, t in old.items():
            if not isinstance(t, torch.Tensor):
                continue
            n = new[name]
            assert type(n) is type(t) and n.dtype == t.dtype and n.stride() == t.stride(), name
            assert torch.equal(n, t) and n.requires_grad == t.requires_grad, name
    sd = back.state_dict
    assert sd["b.weight"].untyped_storage().data_ptr() == sd["a.weight"].untyped_storage().data_ptr()
    assert sd["b.weight"].data_ptr() == sd["a.weight"].data_ptr()
    x = torch.randn(2, 12)
    torch.testing.assert_close(back.module()(x), ep.module()(x), rtol=0, atol=0)


def test_loaded_weights_are_private_to_the_process(tmp_path):
    ep = torch.export.export(Tied(), (torch.randn(2, 12),))
    _save(ep, tmp_path)
    before = (tmp_path / weights.BIN).read_bytes()
    back = _load(tmp_path)
    with torch.no_grad():
        back.state_dict["a.weight"].mul_(0)          # copy-on-write: the file is unchanged
    assert (tmp_path / weights.BIN).read_bytes() == before


def test_split_refuses_other_tensor_kinds_and_leaves_the_program_alone():
    m = torch.nn.Linear(4, 4)
    ep = torch.export.export(m, (torch.randn(2, 4),))
    ep._state_dict["weight"] = torch.nn.Parameter(ep.state_dict["weight"].to_sparse(), requires_grad=False)
    assert weights.split(ep) is None
    ep2 = torch.export.export(m, (torch.randn(2, 4),))
    program, _ = weights.split(ep2)
    assert ep2.state_dict["weight"].device.type == "cpu"         # the original is untouched
    assert program.state_dict["weight"].device.type == "meta"


@pytest.mark.parametrize("edit", ["shape", "dtype", "name", "extent", "format", "json"])
def test_an_index_that_does_not_describe_the_program_is_refused(tmp_path, edit):
    ep = torch.export.export(Tied(), (torch.randn(2, 12),))
    _save(ep, tmp_path)
    path = tmp_path / weights.INDEX
    index = json.loads(path.read_text())
    e = next(e for e in index["tensors"] if e["name"] == "a.weight")
    if edit == "shape":
        e["shape"] = [20, 13]
    elif edit == "dtype":
        e["dtype"] = "float64"
    elif edit == "name":
        e["name"] = "a.weights"
    elif edit == "extent":
        e["storage_offset"] = 1
    elif edit == "format":
        index["format"] = 99
    text = "{not json" if edit == "json" else json.dumps(index)
    path.write_text(text)
    with pytest.raises(DamagedFileError) as err:
        _load(tmp_path)
    assert err.value.path == str(path)


def test_a_short_weights_file_is_refused(tmp_path):
    ep = torch.export.export(Tied(), (torch.randn(2, 12),))
    _save(ep, tmp_path)
    data = (tmp_path / weights.BIN).read_bytes()
    (tmp_path / weights.BIN).write_bytes(data[:-64])
    with pytest.raises(DamagedFileError, match="bytes where"):
        _load(tmp_path)


def test_chunked_records_name_the_damaged_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(integrity, "PARALLEL_MIN", 10000)
    monkeypatch.setattr(integrity, "CHUNK_BYTES", 4096)
    p = tmp_path / "big.bin"
    data = bytearray(os.urandom(30000))
    p.write_bytes(bytes(data))
    rec = integrity.record(p)
    assert rec["chunk_bytes"] == 4096 and len(rec["sha256_chunks"]) == 8 and "sha256" not in rec
    assert integrity.problem(p, rec) is None
    data[9000] ^= 1
    p.write_bytes(bytes(data))
    assert integrity.problem(p, rec) == "is corrupted (bytes 8192-12287 differ from what was written)"
    p.write_bytes(bytes(data[:20000]))
    assert "truncated" in integrity.problem(p, rec)
    for bad in ({"sha256_chunks": "x"}, {"chunk_bytes": 1}):   # damaged, or absurd, records
        assert integrity.problem(p, {**rec, "size": None, **bad}).startswith("has a damaged record")
    with pytest.raises(ValueError, match="at least"):
        integrity.chunk_digests(p, 16)


class Odd(torch.nn.Module):
    """Storages of one start but two lengths, a buffer that requires grad."""

    def __init__(self):
        super().__init__()
        buf = bytearray(torch.randn(16).numpy().tobytes())
        self.register_buffer("short", torch.frombuffer(buf, dtype=torch.float32, count=4))
        self.register_buffer("long", torch.frombuffer(buf, dtype=torch.float32))
        self.register_buffer("g", torch.randn(16, requires_grad=True) * 2)

    def forward(self, x):
        return x + self.long + self.short.sum() + self.g


def test_odd_storages_and_buffers_that_require_grad_round_trip(tmp_path):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # frombuffer of a bytearray: writable, fine
        ep = torch.export.export(Odd(), (torch.randn(2, 16),))
    _save(ep, tmp_path)
    back = _load(tmp_path)
    for name in ("short", "long", "g"):
        old, new = ep.state_dict[name], back.state_dict[name]
        assert torch.equal(new, old) and new.requires_grad == old.requires_grad, name
    assert back.state_dict["long"].data_ptr() == back.state_dict["short"].data_ptr()


def test_pending_conjugates_are_left_to_torchs_archive():
    class Conj(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.randn(3, dtype=torch.complex64).conj())

        def forward(self, x):
            return x + self.c.real
    ep = torch.export.export(Conj(), (torch.randn(3),))
    if ep.state_dict["c"].is_conj():
        assert weights.split(ep) is None


def test_load_without_reference_returns_none_in_its_place(tmp_path):
    import cutlass_offload as co
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    co.compile(model, (torch.randn(2, 8),), arch="sm_90a", out_dir=tmp_path / "m", glue="eager")
    compiled, ref, inputs = co.load(tmp_path / "m", reference=False)
    assert ref is None and isinstance(inputs, tuple)
    _, ref, _ = co.load(tmp_path / "m")
    torch.testing.assert_close(ref(*inputs), model(*inputs))


def test_load_says_where_its_time_went(tmp_path):
    import cutlass_offload as co
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    compiled = co.compile(model, (torch.randn(2, 8),), arch="sm_90a", out_dir=tmp_path / "m", glue="eager")
    assert compiled.load_phases is None
    loaded, _, _ = co.load(tmp_path / "m", reference=False)
    phases = loaded.load_phases
    assert {"check files", "program", "weights", "unlift", "partition, select, offload"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and phases["reference"] < 1.0
