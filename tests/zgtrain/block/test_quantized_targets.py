"""A quantized boundary codec (materialize.codec int8; zgdata/store/quant.py) on the real tiny project.

Its parameters are lineage (a new fingerprint; the lossless codecs' stays), `zg data verify` recomputes the stored
(quantized) values bitwise, `zg data inspect --json` shows the scheme and the measured error, a block trained on
the stored pairs with a stop and a resume equals one trained on online pairs (the teacher's, quantized and
dequantized by the same code) bit for bit, and a pair whose codec lineage disagrees is refused in one line.
"""

from __future__ import annotations

import json
import shutil

import lance
import numpy as np
import pytest
import torch

from tests.helpers.projects import copy_project, project_of, set_params
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.store.lance_io import schema_meta
from zgdata.store.quant import roundtrip_tensor
from zgdata.store.reader import BoundaryDataset
from zgtrain.block.train import train_block


@pytest.fixture(scope="module")
def int8_project(tiny_built, tmp_path_factory):
    """The tiny project rematerialized with materialize.codec int8 (the reference objective: noisy_regress)."""
    root = copy_project(tiny_built, tmp_path_factory.mktemp("int8") / "proj")
    set_params(root, {"materialize.codec": "int8", "train.objective": "noisy_regress"})
    shutil.rmtree(root / "data" / "boundaries")
    zg_main("data", "materialize", cwd=root)
    return root


def test_int8_is_lineage_verifies_and_inspect_shows_its_error(int8_project, tiny_built):
    lossless = BoundaryDataset(Layout(tiny_built).boundary("h02"))
    b = BoundaryDataset(Layout(int8_project).boundary("h02"))
    assert b.codec == "int8" and "codec" not in lossless.meta["lineage"]
    assert b.meta["lineage"]["codec"]["bits"] == 8 and b.meta["lineage"]["codec"]["outliers_per_token"] == 4
    assert b.fingerprint != lossless.fingerprint
    assert {k: v for k, v in b.meta["lineage"].items() if k != "codec"} == lossless.meta["lineage"]
    stored, exact = b.take(np.arange(4)), lossless.take(np.arange(4))
    assert not torch.equal(stored, exact)  # lossy, and exactly the online path's quantization of the teacher's
    assert torch.equal(stored.view(torch.int16), roundtrip_tensor(exact, "int8").view(torch.int16))
    verify = json.loads(zg_main("data", "verify", "--json", cwd=int8_project).stdout)
    assert verify["status"] == "ok" and verify["lineage"]["codec"]["name"] == "int8", verify


def test_a_virtual_h00_verifies_under_a_quantized_codec(int8_project, tmp_path):
    """materialize.virtual_first: h00 is computed from the tokens and quantized as a stored one would be; verify's
    fresh teacher pass applies the same round trip (the smollm2 profile's verify stage failed without it)."""
    root = copy_project(int8_project, tmp_path / "proj")
    set_params(root, {"materialize.virtual_first": True})
    verify = json.loads(zg_main("data", "verify", "--json", cwd=root).stdout)
    assert verify["status"] == "ok" and verify["checked_seq_ids"], verify
    info = {i["name"]: i for i in json.loads(zg_main("data", "inspect", "--json", cwd=int8_project).stdout)}
    err = info["h02"]["quant_error"]
    assert info["h02"]["codec"] == "int8" and info["h02"]["codec_params"]["bits"] == 8
    assert 0 < err["rel_rms"] < 0.05 and err["rel_rms"] <= err["worst_channel_rel_rms"] < 0.2, err


def test_cached_with_a_resume_equals_online_under_int8(int8_project, tmp_path):
    root = copy_project(int8_project, tmp_path / "proj")
    layout = Layout(root)
    stopped = train_block(project_of(root), "b00", stop_after=5, layout=layout)
    assert stopped.status == "stopped" and stopped.step == 5
    resumed = train_block(project_of(root), "b00", layout=layout)
    assert resumed.status == "done"
    shutil.rmtree(root / "data" / "boundaries")  # online can only get its pairs from the teacher
    online = train_block(project_of(root), "b00", targets="online", restart=True, layout=layout)
    assert (resumed.targets, online.targets) == ("cached", "online")
    assert online.state_sha256 == resumed.state_sha256 and online.heldout_loss == resumed.heldout_loss


def test_a_pair_with_mismatched_codec_lineage_is_refused(int8_project, tmp_path):
    root = copy_project(int8_project, tmp_path / "proj")
    path = Layout(root).boundary("h02")
    ds = lance.dataset(str(path))
    lineage = {k: v for k, v in schema_meta(ds.schema)["lineage"].items() if k != "codec"}
    ds.update_schema_metadata({"zg.lineage": json.dumps(lineage, sort_keys=True)})
    with pytest.raises(ZgError) as err:
        train_block(project_of(root), "b00", layout=Layout(root))
    msg = str(err.value)
    assert "lineage mismatch on codec: h00 has int8 (8 bits, 4 outliers/token) but h02 has a lossless codec" in msg
    assert "\n" not in msg.split(". ")[0]


def test_a_virtual_h00_is_quantized_as_a_stored_one(tiny_built):
    from zgdata.config import MaterializeConfig
    from zgdata.materialize.virtual import VirtualBoundary

    layout, rows = Layout(tiny_built), np.arange(5)
    vb = VirtualBoundary(layout, MaterializeConfig(codec="int8", virtual_first=True))
    assert vb.meta["lineage"]["codec"]["name"] == "int8"
    exact = BoundaryDataset(layout.boundary("h00")).take(rows)  # the lossless h00 the virtual one equals
    assert torch.equal(vb.take(rows).view(torch.int16), roundtrip_tensor(exact, "int8").view(torch.int16))
