"""W2 probe (exploratory, not a product benchmark): time variants of the DS4.1 W2 expansion."""

import statistics
import sys

sys.path.insert(0, "benchmarks")
import torch
from bench_expand import layer_planes
from timing import L2_FLUSH_BYTES, capture, replay_times

from csf_kernels import runtime
from csf_kernels.expand import inline_expansion_launches
from csf_kernels.programs import ProgramSpec

runtime.unfreeze()
flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
planes = layer_planes()[1]


def run(proj, name, facts, grid=None):
    plane, inline = planes[proj]
    out = torch.empty_like(plane)
    (launch,) = inline_expansion_launches(inline, out)
    facts = {**launch.spec.fact, **facts}
    spec = ProgramSpec.of(launch.spec.kernel, launch.spec.version, **facts)
    b = runtime.program(spec).bind(grid or launch.grid, *launch.args)
    out.fill_(0xAB)
    b()
    torch.cuda.synchronize()
    exact = torch.equal(out, plane)
    t = statistics.median(replay_times(capture(b), 30, flush))
    print(f"{proj} {name:28s} {t * 1e6:8.1f} us exact={exact} {spec.describe()}", flush=True)


run("w2", "narrow merged w4", {})
run("w2", "narrow merged w2", {"num_warps": 2})
run("w2", "narrow merged w8", {"num_warps": 8})
