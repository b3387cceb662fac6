"""zgdata.core.timing: spans record into active collectors only, across threads; the product code's spans count right."""

from __future__ import annotations

import math
import shutil
import threading

import lance
import pytest
import yaml

from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.core import timing
from zgdata.core.timing import collect, span
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.store.reader import BoundaryDataset, BoundaryPair


def test_span_without_collector_records_nothing():
    assert timing._active == ()
    with span("outside", rows=3) as sp:
        sp.nbytes = 7
    with collect() as t:
        pass
    with span("after"):
        pass
    assert t.names() == [] and t["outside"].count == 0 and timing._active == ()
    with pytest.raises(ValueError, match="boom"):  # an inactive span does not swallow errors either
        with span("outside"):
            raise ValueError("boom")


def test_counts_rows_bytes_nesting_and_errors():
    with collect(samples=True) as t:
        with span("outer", rows=10):
            for i in range(3):
                with span("inner", rows=i) as sp:
                    sp.nbytes = 100 * i  # known only inside the block
        with pytest.raises(RuntimeError):
            with span("failing"):
                raise RuntimeError("still timed")
    assert timing._active == ()
    assert t.names() == ["failing", "inner", "outer"]
    outer, inner = t["outer"], t["inner"]
    assert (outer.count, outer.rows, outer.nbytes) == (1, 10, 0)
    assert (inner.count, inner.rows, inner.nbytes) == (3, 0 + 1 + 2, 0 + 100 + 200)
    assert t["failing"].count == 1
    # the inner spans lie inside the outer one; samples are the per-span durations
    assert outer.first_start <= inner.first_start <= inner.last_end <= outer.last_end
    assert len(inner.samples) == 3 and math.isclose(sum(inner.samples), inner.seconds, rel_tol=1e-9, abs_tol=1e-12)
    assert outer.seconds >= sum(inner.samples)
    assert t["inner"] is not t["inner"]  # copies: a reader never sees a half-updated Stat


def test_window_is_the_earliest_start_and_the_latest_end_in_any_closing_order():
    """Spans close in any order across threads (materialize's writer, the loader's prefetch): ``first_start`` is the
    earliest start and ``last_end`` the latest end of all of them, not the last span's."""
    t = timing.Timings(samples=True)
    for start, end in ((5.0, 6.0), (1.0, 2.0), (3.0, 9.0), (4.0, 4.5)):
        t.add("x", start, end, rows=1, nbytes=2)
    s = t["x"]
    assert (s.first_start, s.last_end) == (1.0, 9.0)
    assert (s.count, s.seconds, s.rows, s.nbytes) == (4, 8.5, 4, 8)
    assert s.samples == [1.0, 1.0, 6.0, 0.5]


def test_spans_from_many_threads_all_count():
    n_threads, per_thread = 8, 500
    start = threading.Barrier(n_threads)

    def work(k):
        start.wait()
        for _ in range(per_thread):
            with span("t", rows=k, nbytes=1):
                pass

    with collect() as t:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    s = t["t"]
    assert s.count == n_threads * per_thread
    assert s.rows == per_thread * sum(range(n_threads)) and s.nbytes == n_threads * per_thread
    assert s.samples == []  # not kept unless asked for


def test_nested_collectors_each_see_their_own_window():
    with collect() as outer:
        with span("a"):
            pass
        with collect() as inner:
            with span("b"):
                pass
        with span("c"):
            pass
    assert outer.names() == ["a", "b", "c"] and inner.names() == ["b"]
    # left out of order, each collector still removes only itself
    a = collect()
    b = collect()
    ta, tb = a.__enter__(), b.__enter__()
    a.__exit__(None, None, None)
    with span("x"):
        pass
    b.__exit__(None, None, None)
    assert ta.names() == [] and tb.names() == ["x"] and timing._active == ()


def _commit_groups(n_batches: int, batch_size: int, commit_rows: int) -> int:
    """How many Lance appends the writer makes: it commits once its pending batches reach commit_rows."""
    per_commit = -(-commit_rows // batch_size)
    return -(-n_batches // per_commit)


def test_real_materialize_reports_its_stages(tiny_project):
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    cfg, part = section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")
    layout = Layout(tiny_project)
    shutil.rmtree(layout.boundaries_dir)
    with collect(samples=True) as t:
        res = materialize(cfg, part, layout=layout)
    assert not res.skipped
    n_rows = res.rows
    n_batches = -(-n_rows // cfg.batch_size)
    commits = _commit_groups(n_batches, cfg.batch_size, cfg.commit_rows)
    assert 1 < commits < n_batches  # the tiny profile exercises grouped commits
    assert t["materialize.load_teacher"].count == 1 and t["materialize.finalize"].count == 1
    for name in ("materialize.read_tokens", "materialize.capture"):
        assert (t[name].count, t[name].rows, len(t[name].samples)) == (n_batches, n_rows, n_batches), name
    commit = t["materialize.commit"]
    seq_len = res.tokens // n_rows
    assert (commit.count, commit.rows) == (commits, n_rows)
    for name in part.names:  # staged: one version per commit group; published: one version, compacted
        ds = lance.dataset(str(layout.boundary(name)))
        assert len(ds.versions()) == 1 and len(ds.get_fragments()) == 1, name
    c = BoundaryDataset(layout.boundary(part.names[0])).take([0]).shape[-1]
    assert commit.nbytes == n_rows * seq_len * c * 2 * len(part.names)  # bf16 storage
    assert t["materialize.capture"].last_end <= commit.last_end <= t["materialize.finalize"].first_start

    with collect() as again:  # complete outputs: skipped, no stage ran
        assert materialize(cfg, part, layout=layout).skipped
    assert again.names() == []

    pair = BoundaryPair(layout.boundary(part.names[0]), layout.boundary(part.names[1]))
    with collect() as reads:
        x, y = pair.take([5, 1, 3])
    r = reads["reader.take"]
    assert (r.count, r.rows, r.nbytes) == (2, 6, x.numel() * 2 + y.numel() * 2)
