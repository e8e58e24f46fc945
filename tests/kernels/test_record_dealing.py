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


def _walk(rank: int, warps: int, slots: int, valid: list[bool], k_steps: int, nvfp4: bool):
    """One warp's events, as the program runs them: ``("copy", unit, record)``, ``("wait", unit, record)`` and
    ``("fill", stage)`` (stages counted over the CTA's walk)."""
    cols = k_steps * (4 if nvfp4 else 2)
    tiles = -(-cols // TILE_COLS)
    full = cols // TILE_COLS
    events, staged = [], []  # staged: the copies in flight, oldest first
    warm, cursor = 0, 0
    for walked, ok in enumerate(valid):
        first = first_dealt(rank, walked * tiles, warps)
        stage0 = walked * k_steps
        ok_next = walked + 1 < len(valid) and valid[walked + 1]
        if ok:
            if warm == 0:
                cursor = first
                for _ in range(slots):
                    if cursor < tiles:
                        staged.append((walked, cursor))
                        events.append(("copy", walked, cursor))
                        cursor += warps
            next_table = 0
            for j in range(first, tiles, warps):
                assert staged, f"warp {rank} waits on a record it never copied (unit {walked}, record {j})"
                assert staged.pop(0) == (walked, j), "records decoded out of their copies' order"
                events.append(("wait", walked, j))
                if cursor < tiles:
                    staged.append((walked, cursor))
                    events.append(("copy", walked, cursor))
                    cursor += warps
                elif ok_next and cursor < 2 * tiles:
                    next_table = 1
                    staged.append((walked + 1, cursor - tiles))
                    events.append(("copy", walked + 1, cursor - tiles))
                    cursor += warps
                assert len(staged) <= slots
                steps = 1 if nvfp4 else (TILE_COLS if j < full else cols - full * TILE_COLS) // 2
                events += [("fill", stage0 + j * (1 if nvfp4 else 2) + h) for h in range(steps)]
            warm = next_table
            cursor -= tiles
        else:
            for j in range(first, tiles, warps):
                steps = 1 if nvfp4 else (TILE_COLS if j < full else cols - full * TILE_COLS) // 2
                events += [("fill", stage0 + j * (1 if nvfp4 else 2) + h) for h in range(steps)]
            warm = 0
    assert not staged, f"warp {rank} ends with copies in flight: {staged}"
    return events


@pytest.mark.parametrize("warps, slots", [(1, 4), (3, 2)])
@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize("k_steps", [1, 2, 3, 9, 45])
def test_every_stage_is_filled_once_by_its_records_warp(warps, slots, nvfp4, k_steps):
    rng = random.Random(k_steps * 7 + warps + nvfp4)
    for _ in range(20):
        valid = [rng.random() > 0.3 for _ in range(rng.randint(1, 9))]
        fills = {}
        for rank in range(warps):
            for event in _walk(rank, warps, slots, valid, k_steps, nvfp4):
                if event[0] == "fill":
                    assert event[1] not in fills, f"stage {event[1]} filled twice"
                    fills[event[1]] = rank
        assert sorted(fills) == list(range(len(valid) * k_steps)), "a ring stage left unfilled"
        # a stage's filler holds the record covering it: record j of a unit, from stage 2 j (MXFP4) or j (NVFP4)
        per_record = 1 if nvfp4 else 2
        tiles = -(-k_steps * (4 if nvfp4 else 2) // TILE_COLS)
        for stage, rank in fills.items():
            unit, s = divmod(stage, k_steps)
            assert rank == (unit * tiles + s // per_record) % warps


def test_dealt_warps_take_turns_across_units():
    # 5 records a unit over 3 warps: unit 1 starts with the warp after the one that took unit 0's last record
    assert [first_dealt(r, 0, 3) for r in range(3)] == [0, 1, 2]
    assert [first_dealt(r, 5, 3) for r in range(3)] == [1, 2, 0]
    assert [first_dealt(0, s, 1) for s in range(4)] == [0, 0, 0, 0]
