"""What the search writes about a mix (zgtrain/search/mixes.py), pure: a constraint's entry in choice.json (the
measured latency's base on every figure) and the pool's distance of each member to the earlier ones."""

from __future__ import annotations

from types import SimpleNamespace

from zgtrain.search.mixes import constraint, pool_entries

# a measured cost table as with_table leaves it: the embedding and head (the base) cost 10 ms of the phase
TABLE = {"phase": "decode_ms", "base": {"decode_ms": {"median": 10.0}}}


def test_a_latency_constraint_adds_the_base_to_every_figure():
    """Every mix and the teacher pay the base besides their blocks, so choice.json states whole-model figures:
    the blocks' bound 50 is 60 ms in all, the mix's blocks 20 are 30 ms, the teacher's blocks 40 are 50 ms, and the
    ratio is the mix's whole latency over the teacher's, 30 / 50 = 0.6 (not the blocks' 20 / 40). A cost the
    table does not measure (params) has no base: its figures are the blocks' own, and a zero teacher has no
    ratio."""
    assert constraint("latency", 50.0, {"latency": 20.0}, {"latency": 40.0}, TABLE) == {
        "bound": 60.0,
        "value": 30.0,
        "teacher": 50.0,
        "ratio": 0.6,
    }
    assert constraint("params", 100.0, {"params": 80.0}, {"params": 200.0}, TABLE) == {
        "bound": 100.0,
        "value": 80.0,
        "teacher": 200.0,
        "ratio": 0.4,
    }
    assert constraint("params", 100.0, {"params": 0.0}, {"params": 0.0}, None)["ratio"] is None


def test_pool_distance_is_to_the_closest_earlier_member():
    """A member's "distance" is how many blocks it differs in from the nearest earlier member (the pool's
    diversity guarantee is a minimum over them): (1,1,0) differs from (0,0,0) in 2 blocks; (1,1,1) differs from
    (0,0,0) in 3 but from (1,1,0) in 1, so its distance is 1. The first member has none."""
    blocks = ["b0", "b1", "b2"]
    opts = {
        b: [{"variant": f"{b}-v{j}", "params": 10 - j, "kv_bytes": 4, "active_params": 10 - j} for j in range(2)]
        for b in blocks
    }
    vec = [[((10.0 - j,), 0.1 * j) for j in range(2)] for _ in blocks]
    members = [(0, 0, 0), (1, 1, 0), (1, 1, 1)]
    pool = pool_entries(opts, blocks, members, vec, SimpleNamespace(diversity=1))
    assert [p["distance"] for p in pool] == [None, 2, 1]
    assert [p["rank"] for p in pool] == [1, 2, 3]
    assert pool[2]["mix"] == {"b0": "b0-v1", "b1": "b1-v1", "b2": "b2-v1"}
    assert "(closest: 1)" in pool[2]["why"]
