"""The band builder on plain event lists, as any source of trace events (an experiment,
an imported snapshot) would give it: stacking, naming, grouping, thinning, ticks."""

import random
from typing import Any

from app.figures import bands, ticks
from app.traces import replay
from tests.results.trace_data import many_events


def ev(t: float, action: str, addr: int | None = None, size: int = 0, **extra: Any) -> dict:
    return {"t_us": t, "action": action, "addr": addr, "size": size, **extra}


def test_bands_stack_in_allocation_order_and_drop_when_one_beneath_is_freed() -> None:
    events = [
        ev(10, "mark", name="setup"),
        ev(11, "alloc", 1, 100, phase="setup"),
        ev(12, "alloc", 2, 200, phase="setup"),
        ev(13, "mark", name="op"),
        ev(14, "alloc", 3, 400, phase="op"),
        ev(15, "free", 1, 100, phase="op"),
        ev(16, "free", 3, 400, phase="op"),
    ]
    tl = bands.build(events)
    assert tl.start_us == 10 and tl.end_us == 16
    assert [(p.name, p.start_us, p.end_us) for p in tl.phases] == [
        ("setup", 10, 13),
        ("op", 13, 16),
    ]
    assert [(a.size, a.start_us, a.end_us) for a in tl.allocs] == [
        (100, 11, 15),
        (200, 12, None),
        (400, 14, 16),
    ]
    layers = {layer.alloc.size: (layer.xs, layer.lows) for layer in bands.stack(tl)}
    assert layers[100] == ([11], [0])
    assert layers[200] == ([12, 15], [100, 0])  # drops when the 100 beneath it goes
    assert layers[400] == ([14, 15], [300, 200])
    assert tl.peak is not None and (tl.peak.t_us, tl.peak.allocated) == (14, 700)
    assert tl.peak_phase == "op" and tl.grouped == 0 and tl.events == 7
    assert [(p.t_us, p.allocated, p.kept) for p in tl.points] == [
        (10, 0, 0),
        (11, 100, 100),
        (12, 300, 300),
        (14, 700, 700),
        (15, 600, 600),
        (16, 200, 200),
    ]


def test_names_match_phase_size_and_lifetime_in_order() -> None:
    events = [
        ev(0, "mark", name="setup"),
        ev(1, "alloc", 1, 4096, phase="setup"),  # input a (4000 B, rounded up to 4096)
        ev(2, "alloc", 2, 4096, phase="setup"),  # input b
        ev(3, "mark", name="op"),
        ev(4, "alloc", 3, 8192, phase="op"),  # an earlier call's output
        ev(5, "alloc", 4, 1024, phase="op"),  # a temporary
        ev(6, "free", 4, 1024, phase="op"),
        ev(7, "free", 3, 8192, phase="op"),
        ev(8, "alloc", 5, 8192, phase="op"),  # the output kept
        ev(9, "alloc", 6, 512, phase="op"),  # kept by a library
    ]
    names = [
        bands.Name("input a", "setup", 4000, count=1),
        bands.Name("input b", "setup", 4000, count=1),
        bands.Name("output", "op", 8192, lives=True, count=1),
        bands.Name("output, an earlier call", "op", 8192, lives=False),
        bands.Name("workspace", "op", lives=True),
        bands.Name("temporary", "op", lives=False),
    ]
    tl = bands.build(events, names)
    assert [a.name for a in tl.allocs] == [
        "input a",
        "input b",
        "output, an earlier call",
        "temporary",
        "output",
        "workspace",
    ]
    # Unmatched allocations are called after their phase.
    assert [a.name for a in bands.build(events).allocs][:2] == ["setup", "setup"]


def test_a_trace_without_marks_or_events_still_builds() -> None:
    tl = bands.build([ev(5, "alloc", 1, 10), ev(9, "free", 1, 10)])
    assert tl.phases == [] and tl.start_us == 5 and tl.end_us == 9
    empty = bands.build([])
    assert empty.peak is None and empty.allocs == [] and empty.points[0].allocated == 0


def test_only_the_largest_get_bands_and_the_rest_are_grouped_and_thinned() -> None:
    events = many_events(20_000)  # 39,999 events: sizes 100 .. 20,099
    tl = bands.build(events, max_bands=10, buckets=100)
    assert [a.size for a in tl.allocs] == list(range(20_090, 20_100))
    assert tl.grouped == 20_000 - 10 and tl.group_largest == 20_089
    assert len(tl.points) <= 100 + 2 * 10 + 1
    assert tl.peak is not None and tl.peak.allocated == 20_098 + 20_099
    assert max(p.allocated for p in tl.points) == tl.peak.allocated
    # At every point, the kept bands' bytes never exceed what was allocated.
    assert all(0 <= p.kept <= p.allocated for p in tl.points)


def test_ticks_fall_on_round_binary_and_decimal_values() -> None:
    assert ticks.byte_ticks(11.4 * 2**20 * 1.12) == [i * 4 * 2**20 for i in range(5)]
    assert [ticks.byte_label(v) for v in (0, 512, 1536, 2**20, 1.5 * 2**30)] == [
        "0",
        "512 B",
        "1.5 KiB",
        "1 MiB",
        "1.5 GiB",
    ]
    assert ticks.nice_ticks(0, 287.7) == [0, 50, 100, 150, 200, 250]
    assert ticks.nice_ticks(-4, 9.8) == [-4, -2, 0, 2, 4, 6, 8]
    assert ticks.time_unit(0.5) == ("µs", 1e-3) and ticks.time_unit(300) == ("ms", 1.0)


def test_the_peak_and_largest_agree_with_a_plain_replay() -> None:
    """The peak table reads the peak, what was alive then and the largest blocks from the
    timeline's one pass: on random traces they are the plain replays', field for field."""
    rnd = random.Random(7)
    for _ in range(150):
        events, live, t = [], [], 0.0
        for i in range(rnd.randint(0, 200)):
            t += rnd.random()
            r = rnd.random()
            if r < 0.05:
                events.append(ev(t, "mark", name=f"p{i}"))
            elif r < 0.1:
                grows = rnd.random() < 0.5
                action = "segment_alloc" if grows else "segment_free"
                events.append(ev(t, action, rnd.randint(0, 5) << 30, 2**21))
            elif r < 0.6 or not live:
                # Now and then a second alloc at a live address, as a malformed trace has.
                live.append(rnd.choice(live) if live and r < 0.12 else rnd.randint(1, 10**9))
                size = rnd.choice([0, 512, 4096, rnd.randint(1, 10**6)])
                events.append(ev(t, "alloc", live[-1], size, phase=rnd.choice([None, "op"])))
            else:
                addr = live.pop(rnd.randrange(len(live)))
                events.append(ev(t, rnd.choice(["free", "free_completed"]), addr))
        for seq, event in enumerate(events):
            event["seq"] = seq
        top = rnd.choice([1, 5, 20, bands.MAX_BANDS])
        found, largest, n_events, _ = replay.find_peak(events, top)
        tl = bands.build(events)
        assert tl.events == n_events
        if found is None:
            assert tl.peak is None
            continue
        assert tl.peak is not None
        assert (tl.peak.index, tl.peak_seq, tl.peak.t_us, tl.peak.allocated) == (
            found.index,
            found.seq,
            found.t_us,
            found.allocated,
        )
        assert (tl.peak.reserved, tl.peak_phase) == (found.reserved, found.phase)
        assert [(a.addr, a.size, a.seq, a.start_us, a.phase) for a in tl.largest[:top]] == [
            (b.addr, b.size, b.seq, b.t_us, b.phase) for b in largest
        ]
        alive = replay.alive_at(events, found.index)
        assert tl.alive_count == len(alive)
        assert [(a.addr, a.size, a.seq, a.phase) for a in tl.alive_at_peak[:top]] == [
            (b.addr, b.size, b.seq, b.phase) for b in alive[:top]
        ]
