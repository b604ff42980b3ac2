"""The join against its witness (a DuckDB query on the same tables), one shot and window by window
(the window by window join is the correlation core's, engine/correlate)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.correlate.tables import check_gil, check_pauses
from engine.join import overlap_pairs, overlap_totals
from engine.join.kernels import is_sorted_by
from test_join_witness import adversarial_tables, canonical, duckdb_overlaps, gil_frame, overlap_frame, pauses_frame


@pytest.mark.parametrize("slack_ns", [0, 1, 25, 500])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlaps_equal_duckdb_on_adversarial_tables(seed, slack_ns):
    pauses, gil = adversarial_tables(seed)
    ours = overlap_frame(pauses, gil, slack_ns=slack_ns)
    assert len(ours) > 0
    pd.testing.assert_frame_equal(canonical(ours), canonical(duckdb_overlaps(pauses, gil, slack_ns)))


def test_duplicates_are_rows_in_the_join_and_dropped_by_the_table_check():
    pauses = pauses_frame([(0, 100)])
    gil = gil_frame([(1, 1, "released", 10, 20)] * 3 + [(1, 2, "released", 10, 20)])
    assert len(overlap_frame(pauses, gil)) == 4  # as in SQL: every row is a row
    checked, dropped = check_gil(gil)
    assert dropped == 2
    assert len(overlap_frame(pauses, checked)) == 2


def test_touching_and_zero_length_never_match():
    pauses = pauses_frame([(10, 20), (30, 30)])
    gil = gil_frame([(1, 1, "released", 0, 10), (1, 1, "released", 20, 30), (1, 2, "waiting", 15, 15),
                     (1, 2, "waiting", 25, 35)])
    assert len(overlap_frame(pauses, gil)) == 0
    near = overlap_frame(pauses, gil, slack_ns=5)
    assert sorted(near.slack_ns) == [0, 0, 5]
    assert near.near_miss.all()


def test_rows_refer_to_the_callers_order_when_input_is_unsorted():
    rng = np.random.default_rng(3)
    g_start = rng.integers(0, 10_000, 2_000)
    g_end = g_start + rng.integers(0, 50, 2_000)
    p_start = rng.integers(0, 10_000, 300)
    p_end = p_start + rng.integers(0, 200, 300)
    pause_rows, gil_rows = overlap_pairs(p_start, p_end, g_start, g_end)
    assert len(pause_rows) > 100
    assert (g_start[gil_rows] < p_end[pause_rows]).all() and (p_start[pause_rows] < g_end[gil_rows]).all()
    order = np.argsort(g_start, kind="stable")
    sorted_pairs = overlap_pairs(p_start, p_end, g_start[order], g_end[order])
    assert sorted(zip(pause_rows, gil_rows)) == sorted(zip(sorted_pairs[0], order[sorted_pairs[1]]))


def test_totals_equal_sums_over_the_pairs():
    pauses, gil = adversarial_tables(4)
    counts, totals = overlap_totals(pauses.start_ns, pauses.end_ns, gil.start_ns, gil.end_ns)
    witness = duckdb_overlaps(pauses, gil).groupby("pause_id").overlap_ns.agg(["size", "sum"])
    witness = witness.reindex(pauses.pause_id, fill_value=0)
    assert counts.tolist() == witness["size"].tolist()
    assert totals.tolist() == witness["sum"].tolist()


def test_one_interval_spanning_everything_pairs_with_every_pause():
    p_start = np.arange(0, 1_000_000, 1_000)
    pause_rows, gil_rows = overlap_pairs(p_start, p_start + 10, [-1, 5], [10**9, 6])
    assert sorted(pause_rows[gil_rows == 0]) == list(range(p_start.size))
    assert pause_rows[gil_rows == 1].tolist() == [0]


def _intervals(max_start=60, max_length=15, max_size=25):
    return st.lists(st.tuples(st.integers(0, max_start), st.integers(0, max_length)), max_size=max_size)


@settings(max_examples=150, deadline=None)
@given(_intervals(), _intervals(max_size=40), st.sampled_from([0, 0, 1, 4]), st.randoms(use_true_random=False))
def test_overlaps_equal_duckdb_on_random_tables(pause_spans, gil_spans, slack_ns, random):
    pauses = pauses_frame([(s, s + n) for s, n in pause_spans])
    gil = gil_frame([(random.randint(1, 2), random.randint(1, 3), random.choice(["released", "waiting"]), s, s + n)
                     for s, n in gil_spans])
    pd.testing.assert_frame_equal(
        canonical(overlap_frame(pauses, gil, slack_ns=slack_ns)), canonical(duckdb_overlaps(pauses, gil, slack_ns))
    )


def _feed_in_windows(pauses, gil, slack_ns, rng, max_delay=30, lag=0):
    """Deliver each interval at a random time after it ends, in batches cut at random times.

    The watermark given with each batch is the latest valid promise (the earliest start of
    anything still to come) minus `lag`, so window edges cut through running intervals.
    """
    pauses = pauses.assign(arrival=pauses.end_ns + rng.integers(0, max_delay, len(pauses)))
    gil = gil.assign(arrival=gil.end_ns + rng.integers(0, max_delay, len(gil)))
    last = int(max(pauses.arrival.max(), gil.arrival.max()))
    cuts = np.unique(np.append(rng.integers(0, last, rng.integers(1, 30)), last))
    from engine.correlate import Correlator
    from engine.correlate.inputs import gil_rows_from_frame

    core = Correlator(slack_ns)
    emitted, previous = [], -np.inf
    for cut in cuts:
        batch_p = pauses[(pauses.arrival > previous) & (pauses.arrival <= cut)].drop(columns="arrival")
        batch_g = gil[(gil.arrival > previous) & (gil.arrival <= cut)].drop(columns="arrival")
        future = pd.concat([pauses[pauses.arrival > cut].start_ns, gil[gil.arrival > cut].start_ns])
        watermark = int(min(future.min() if len(future) else cut, cut)) - lag
        watermark = max(watermark, core.watermark_ns)
        batch_g = check_gil(batch_g.sample(frac=1, random_state=2))[0]
        emitted.append(core.push(pauses=check_pauses(batch_p.sample(frac=1, random_state=1)), gil=gil_rows_from_frame(batch_g),
                                 watermark_ns=watermark).overlaps)
        previous = cut
    emitted.append(core.finish().overlaps)
    return __import__("pyarrow").concat_tables(emitted).to_pandas()


@pytest.mark.parametrize("slack_ns", [0, 20])
@pytest.mark.parametrize("seed", range(6))
def test_window_by_window_equals_one_shot(seed, slack_ns):
    rng = np.random.default_rng(seed)
    pauses, gil = adversarial_tables(seed)
    one_shot = overlap_frame(check_pauses(pauses), check_gil(gil)[0], slack_ns=slack_ns)
    windowed = _feed_in_windows(pauses, gil, slack_ns, rng, lag=int(rng.integers(0, 50)))
    assert len(one_shot) > 0
    pd.testing.assert_frame_equal(canonical(windowed), canonical(one_shot))


@settings(max_examples=40, deadline=None)
@given(_intervals(max_start=200), _intervals(max_start=200, max_size=60), st.sampled_from([0, 3]),
       st.integers(0, 2**32 - 1))
def test_window_by_window_equals_one_shot_on_random_tables(pause_spans, gil_spans, slack_ns, seed):
    pauses = pauses_frame([(s, s + n) for s, n in pause_spans])
    gil = gil_frame([(1, s % 3, "released", s, s + n) for s, n in gil_spans])
    if pauses.empty or gil.empty:
        return
    one_shot = overlap_frame(check_pauses(pauses), check_gil(gil)[0], slack_ns=slack_ns)
    windowed = _feed_in_windows(pauses, gil, slack_ns, np.random.default_rng(seed))
    pd.testing.assert_frame_equal(canonical(windowed), canonical(one_shot))


def test_long_and_nested_intervals_at_scale_equal_duckdb():
    """20 k GIL intervals with 1% spanning seconds, 1 k pauses with nested ones, against the witness."""
    rng = np.random.default_rng(11)
    g_start = np.sort(rng.integers(0, 10**9, 20_000))
    g_end = g_start + rng.integers(0, 200_000, g_start.size)
    long = rng.choice(g_start.size, g_start.size // 100, replace=False)
    g_end[long] += rng.integers(10**8, 10**9, long.size)
    p_start = rng.integers(0, 10**9, 1_000)
    p_end = p_start + rng.integers(0, 50_000_000, p_start.size)
    p_end[::50] = p_start[::50] + 5 * 10**8  # some pauses contain many others
    pauses = pauses_frame(list(zip(p_start, p_end)))
    gil = gil_frame([(1, int(t), "released", int(s), int(e)) for t, s, e in zip(rng.integers(1, 9, g_start.size), g_start, g_end)])
    ours = overlap_frame(pauses, gil, slack_ns=1_000)
    assert len(ours) > 100_000
    pd.testing.assert_frame_equal(canonical(ours), canonical(duckdb_overlaps(pauses, gil, 1_000)))


@settings(deadline=None)  # (the first example loads the numba kernel: over 200 ms on a loaded machine)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 5)), max_size=40))
def test_is_sorted_by_says_whether_lexsort_would_move_anything(pairs):
    major = np.array([p[0] for p in pairs], np.int64)
    minor = np.array([p[1] for p in pairs], np.int64)
    order = np.lexsort((minor, major))
    in_order = bool((major[order] == major).all() and (minor[order] == minor).all())
    assert is_sorted_by(major, minor) == in_order
    ordered = (major[order], minor[order])
    assert is_sorted_by(*ordered)
