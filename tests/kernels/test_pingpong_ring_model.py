"""A CPU model of the ping-pong program's ring (``moe/kernels/engine_pingpong.py``, ``docs/moe-engine.md`` §4.13):
warp 0 filling stages in the producers' order (each unit's two halves, ``k_steps`` stages each), the two consumer
warpgroups waiting and releasing by the kernel's pipeline states (warpgroup 2's skipped ``k_steps`` at the start,
each skipping the other's unit after its own), and mbarriers that know a wait's phase by its parity only, under
random interleavings. Run 322's fault (45 K steps, 9 stages at 256 routes) came from warpgroup 2's first wait
passing on the stage's phase 0: the model finds that without the K loops' order barriers and none with them."""

from __future__ import annotations

import random

import pytest


class _Barrier:
    """An mbarrier seen by phase: ``done`` phases completed; a wait on parity ``p`` passes unless the current
    (incomplete) phase has parity ``p`` (PTX ``mbarrier.try_wait.parity``)."""

    def __init__(self):
        self.done = 0

    def passes(self, parity: int) -> bool:
        return (self.done & 1) != parity


class _State:
    """``pipeline.PipelineState``: index and phase; ``skip`` is ``engine_pingpong._skip``."""

    def __init__(self, stages: int, phase: int):
        self.stages, self.index, self.phase, self.count = stages, 0, phase, 0

    def advance(self, n: int = 1):
        at = self.index + n
        self.phase ^= (at // self.stages) & 1
        self.index = at % self.stages
        self.count += n


class RingFault(AssertionError):
    pass


def run_ring(k_steps: int, stages: int, units: int, order: bool, seed: int) -> None:
    """One CTA's walk of ``units`` units; raises :class:`RingFault` where a consumer's wait passes on a stage not
    (yet, or any more) holding the fill it means, where the producer refills a stage its consumer still holds, or
    where the roles deadlock. ``order``: the K loops' order barriers (named barriers 5 and 6)."""
    rng = random.Random(seed)
    full = [_Barrier() for _ in range(stages)]
    empty = [_Barrier() for _ in range(stages)]
    content = [None] * stages  # the global stage a ring stage holds (its last fill)
    released = set()  # global stages released
    owner = {}  # global stage -> warpgroup half consuming it
    total = 2 * units * k_steps
    for j in range(total):
        owner[j] = (j // k_steps) % 2

    # the producer: empty waits from phase 1 (passes at once on a fresh barrier)
    prod = {"state": _State(stages, 1), "j": 0}
    in_flight = []  # issued fills not landed: (ring index, global stage)

    # the consumers: (h) read state, the unit they are on, the step within it, the order-barrier handshakes
    cons = []
    for h in range(2):
        st = _State(stages, 0)
        if h:
            st.advance(k_steps)
        cons.append({"h": h, "state": st, "unit": 0, "step": 0, "held": None})
    arrivals = {0: 0, 1: 0}  # order barrier 5 + h: arrivals of warpgroup 1 + h
    syncs = {0: 0, 1: 0}  # syncs on barrier 5 + h by the other warpgroup

    def consumer_moves(c):
        h = c["h"]
        if c["unit"] >= units:
            return []
        if c["held"] is not None:
            return ["release"]
        if c["step"] == 0 and order and (h > 0 or c["unit"] > 0) and c.get("synced") != c["unit"]:
            other = 1 - h
            if arrivals[other] > syncs[other]:
                return ["sync"]
            return []
        st = c["state"]
        if full[st.index].passes(st.phase):
            return ["wait"]
        return []

    def consumer_do(c, move):
        h, st = c["h"], c["state"]
        if move == "sync":
            syncs[1 - h] += 1
            c["synced"] = c["unit"]
            return
        if move == "wait":
            j = (2 * c["unit"] + h) * k_steps + c["step"]
            if content[st.index] != j:
                raise RingFault(f"warpgroup {h + 1}'s wait on stage {j} passed holding fill {content[st.index]}")
            c["held"] = (st.index, j)
            st.advance()
            return
        index, j = c["held"]  # release
        c["held"] = None
        empty[index].done += 1
        released.add(j)
        c["step"] += 1
        if c["step"] == k_steps:  # the unit's K loop done
            if order and (h == 0 or c["unit"] + 1 < units):
                if arrivals[h] > syncs[h]:
                    raise RingFault(f"warpgroup {h + 1} arrives twice on order barrier {5 + h} before a sync")
                arrivals[h] += 1
            c["unit"] += 1
            c["step"] = 0
            st.advance(k_steps)  # the other's half

    def producer_moves():
        moves = ["land"] if in_flight else []
        if prod["j"] < total:
            st = prod["state"]
            if empty[st.index].passes(st.phase):
                moves.append("fill")
        return moves

    def producer_do(move):
        if move == "land":
            index, j = in_flight.pop(rng.randrange(len(in_flight)))
            content[index] = j
            full[index].done += 1
            return
        st, j = prod["state"], prod["j"]
        if j >= stages and (j - stages) not in released:
            raise RingFault(f"the producer refills stage {j - stages}'s ring stage before its release")
        if any(index == st.index for index, _ in in_flight):
            raise RingFault(f"two fills of ring stage {st.index} in one phase (stage {j})")
        in_flight.append((st.index, j))
        st.advance()
        prod["j"] += 1

    while True:
        options = [("p", m) for m in producer_moves()]
        for c in cons:
            options += [(c, m) for m in consumer_moves(c)]
        if not options:
            break
        who, move = options[rng.randrange(len(options))]
        if who == "p":
            producer_do(move)
        else:
            consumer_do(who, move)
    if prod["j"] < total or in_flight or any(c["unit"] < units for c in cons):
        raise RingFault("deadlock: " + ", ".join(f"wg{c['h'] + 1} unit {c['unit']} step {c['step']}" for c in cons))
    if order and any(arrivals[h] != syncs[h] for h in (0, 1)):
        raise RingFault(f"order barrier arrivals left pending at exit: {arrivals} vs {syncs}")


# (k_steps, stages, units a CTA): gpt-oss (45 steps) at 256 routes (9 stages) and 128 (16), the GPU test's K of 2 and
# 10 steps, a unit count one and several
CASES = [(45, 9, 1), (45, 9, 3), (45, 16, 2), (10, 9, 3), (10, 16, 4), (2, 16, 5), (2, 9, 6), (9, 9, 3), (18, 9, 2)]


@pytest.mark.parametrize(("k_steps", "stages", "units"), CASES)
def test_ordered_pingpong_ring_is_sound(k_steps, stages, units):
    """With the order barriers every consumer wait passes on the fill it means, no stage is refilled before its
    release, nothing deadlocks and no order-barrier arrival is left pending, over many interleavings."""
    for seed in range(200):
        run_ring(k_steps, stages, units, order=True, seed=seed)


@pytest.mark.parametrize(("k_steps", "stages", "units"), [(45, 9, 1), (10, 9, 3), (45, 16, 2)])
def test_unordered_pingpong_ring_faults(k_steps, stages, units):
    """Without them (the kernel of run 322), warpgroup 2's parity waits alias: at gpt-oss's K its first wait passes
    before the stage is filled (the model's form of the GPU fault)."""
    with pytest.raises(RingFault):
        for seed in range(200):
            run_ring(k_steps, stages, units, order=False, seed=seed)


def test_pingpong_named_barrier_ids_are_distinct():
    """The named barriers of every role: 0 (the CTA's), the cooperative epilogue's 1, the gathering warps' 2, the
    ping-pong epilogues' 3 and 4, the ping-pong K loops' order barriers 5 and 6: no two roles share one."""
    from csf_kernels.moe.kernels.engine_epilogue import PINGPONG_BARRIER, PINGPONG_ORDER_BARRIER
    from csf_kernels.moe.kernels.engine_producer import GATHER_BARRIER

    ids = [0, 1, GATHER_BARRIER, PINGPONG_BARRIER + 1, PINGPONG_BARRIER + 2, PINGPONG_ORDER_BARRIER,
           PINGPONG_ORDER_BARRIER + 1]  # fmt: skip
    assert len(set(ids)) == len(ids) and max(ids) < 16
