"""How the inline decoder warps share a CTA's records (``moe/kernels/engine_record_decoder.py``,
``RecordDecoderWarp.run``), modelled step for step on the CPU: each warp's copies, waits and stage fills over a walk
of units (invalid blocks, tail records, units with fewer records than warps). Every ring stage is filled exactly
once, by the warp that decoded its record; a warp waits for its staging slots in the order it filled them, never
with more copies in flight than slots, and never on a copy it did not start (which on the GPU would hang)."""

from __future__ import annotations

import random

import pytest

from csf_kernels.moe.kernels.engine_record_lanes import first_dealt

TILE_COLS = 4


def _units(valid: list[bool], k_steps: int, nvfp4: bool, split_steps: int | None = None):
    """The walk's units as the program's unit map gives them (``moe/kernels/engine_work.py``): ``(valid, first
    record, records, K steps)``, each tile's splits in turn (``split_steps`` None: unsplit)."""
    per = 1 if nvfp4 else 2
    step = split_steps or k_steps
    out = []
    for ok in valid:
        for k0 in range(0, k_steps, step):
            steps = min(step, k_steps - k0)
            out.append((ok, k0 // per, -(-(k0 + steps) // per) - k0 // per, steps))
    return out


def _walk(rank: int, warps: int, slots: int, units: list[tuple[bool, int, int, int]], k_steps: int, nvfp4: bool):
    """One warp's events, as the program runs them: ``("copy", unit, record)``, ``("wait", unit, record)`` and
    ``("fill", stage, record)`` (stages counted over the CTA's walk, records by their place in the row block)."""
    cols = k_steps * (4 if nvfp4 else 2)
    full = cols // TILE_COLS
    events, staged = [], []  # staged: the copies in flight, oldest first
    warm, cursor, seq, stage0 = 0, 0, 0, 0
    for walked, (ok, j0, n, steps_u) in enumerate(units):
        first = first_dealt(rank, seq, warps)
        ok_next, j0_next, n_next = (units[walked + 1][:3]) if walked + 1 < len(units) else (False, 0, 0)
        if ok:
            if warm == 0:
                cursor = first
                for _ in range(slots):
                    if cursor < n:
                        staged.append((walked, j0 + cursor))
                        events.append(("copy", walked, j0 + cursor))
                        cursor += warps
            next_table = 0
            for i in range(first, n, warps):
                j = j0 + i
                assert staged, f"warp {rank} waits on a record it never copied (unit {walked}, record {j})"
                assert staged.pop(0) == (walked, j), "records decoded out of their copies' order"
                events.append(("wait", walked, j))
                if cursor < n:
                    staged.append((walked, j0 + cursor))
                    events.append(("copy", walked, j0 + cursor))
                    cursor += warps
                elif ok_next and cursor < n + n_next:
                    next_table = 1
                    staged.append((walked + 1, j0_next + cursor - n))
                    events.append(("copy", walked + 1, j0_next + cursor - n))
                    cursor += warps
                assert len(staged) <= slots
                steps = 1 if nvfp4 else (TILE_COLS if j < full else cols - full * TILE_COLS) // 2
                events += [("fill", stage0 + i * (1 if nvfp4 else 2) + h, j) for h in range(steps)]
            warm = next_table
            cursor -= n
        else:
            for i in range(first, n, warps):
                j = j0 + i
                steps = 1 if nvfp4 else (TILE_COLS if j < full else cols - full * TILE_COLS) // 2
                events += [("fill", stage0 + i * (1 if nvfp4 else 2) + h, j) for h in range(steps)]
            warm = 0
        seq += n
        stage0 += steps_u
    assert not staged, f"warp {rank} ends with copies in flight: {staged}"
    return events


def _fills(warps, slots, units, k_steps, nvfp4):
    """stage -> (warp, record) over every warp's walk; a stage filled twice fails."""
    fills = {}
    for rank in range(warps):
        for event in _walk(rank, warps, slots, units, k_steps, nvfp4):
            if event[0] == "fill":
                assert event[1] not in fills, f"stage {event[1]} filled twice"
                fills[event[1]] = (rank, event[2])
    return fills


@pytest.mark.parametrize("warps, slots", [(1, 4), (3, 2)])
@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize("k_steps", [1, 2, 3, 9, 45])
def test_every_stage_is_filled_once_by_its_records_warp(warps, slots, nvfp4, k_steps):
    rng = random.Random(k_steps * 7 + warps + nvfp4)
    for _ in range(20):
        valid = [rng.random() > 0.3 for _ in range(rng.randint(1, 9))]
        fills = _fills(warps, slots, _units(valid, k_steps, nvfp4), k_steps, nvfp4)
        assert sorted(fills) == list(range(len(valid) * k_steps)), "a ring stage left unfilled"
        # a stage's filler holds the record covering it: record j of a unit, from stage 2 j (MXFP4) or j (NVFP4)
        per_record = 1 if nvfp4 else 2
        tiles = -(-k_steps * (4 if nvfp4 else 2) // TILE_COLS)
        for stage, (rank, record) in fills.items():
            unit, s = divmod(stage, k_steps)
            assert record == s // per_record and rank == (unit * tiles + s // per_record) % warps


@pytest.mark.parametrize("warps, slots", [(1, 4), (3, 2)])
@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize(("k_steps", "split_steps"), [(9, 2), (9, 4), (9, 6), (45, 24), (80, 20), (3, 2), (45, 2)])
def test_split_units_fill_their_k_ranges_records(warps, slots, nvfp4, k_steps, split_steps):
    """K splits (whole records each): a split unit decodes from its first record, the walk's stages in order each
    filled once from the record covering that K step, and the warps keep taking turns across splits."""
    rng = random.Random(k_steps * 11 + split_steps + warps + nvfp4)
    per_record = 1 if nvfp4 else 2
    for _ in range(20):
        valid = [rng.random() > 0.3 for _ in range(rng.randint(1, 6))]
        units = _units(valid, k_steps, nvfp4, split_steps)
        fills = _fills(warps, slots, units, k_steps, nvfp4)
        assert sorted(fills) == list(range(len(valid) * k_steps)), "a ring stage left unfilled"
        records_before = 0
        stage = 0
        for _ok, j0, n, steps in units:
            for h in range(steps):
                rank, record = fills[stage + h]
                k = j0 * per_record + h  # the unit's K step h: the split starts at record j0's first step
                assert record == k // per_record, (stage + h, record, k)
                assert rank == (records_before + record - j0) % warps
            records_before += n
            stage += steps


def test_dealt_warps_take_turns_across_units():
    # 5 records a unit over 3 warps: unit 1 starts with the warp after the one that took unit 0's last record
    assert [first_dealt(r, 0, 3) for r in range(3)] == [0, 1, 2]
    assert [first_dealt(r, 5, 3) for r in range(3)] == [1, 2, 0]
    assert [first_dealt(0, s, 1) for s in range(4)] == [0, 0, 0, 0]
