"""folder.save_program: torch.export.save without torch's canonical-form self-test.
The archive must be byte for byte what torch.export.save writes (so a torch whose
saved program depended on that check fails here), load again, and leave torch's
canonicalize in place afterwards, also after an error and when nested."""
import zipfile

import pytest
import torch
import torch._export.serde.serialize as serde
import torch.nn as nn

from cutlass_offload import folder


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.ln = nn.Linear(16, 32), nn.LayerNorm(32)

    def forward(self, x):
        h = torch.relu(self.lin(x)).view(x.shape[0], 4, 8).transpose(1, 2).contiguous()
        return self.ln(h.reshape(x.shape[0], 32)) + x.sum(-1, keepdim=True)


def _members(path):
    with zipfile.ZipFile(path) as z:        # names start with the archive's own folder name
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}


def test_the_archive_is_torch_export_saves_and_loads(tmp_path):
    x = torch.randn(3, 16)
    ep = torch.export.export(Small().eval(), (x,))
    torch.export.save(ep, str(tmp_path / "a.pt2"))
    folder.save_program(ep, tmp_path / "b.pt2")
    assert _members(tmp_path / "a.pt2") == _members(tmp_path / "b.pt2")
    loaded = torch.export.load(str(tmp_path / "b.pt2"))
    torch.testing.assert_close(loaded.module()(x), ep.module()(x))


def test_canonicalize_is_restored_after_an_error_and_when_nested(tmp_path):
    real = serde.canonicalize
    with folder._no_canonical_form_check():
        with folder._no_canonical_form_check():
            assert serde.canonicalize is not real
        assert serde.canonicalize is not real          # the outer one still skips it
    assert serde.canonicalize is real
    ep = torch.export.export(Small().eval(), (torch.randn(2, 16),))
    with pytest.raises(Exception):
        folder.save_program(ep, tmp_path / "no such folder" / "p.pt2")
    assert serde.canonicalize is real
