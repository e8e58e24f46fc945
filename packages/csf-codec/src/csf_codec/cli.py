"""The ``csf`` command: compress, decompress, verify and inspect FP4 checkpoints.

Arguments are parsed before torch is imported, so ``--help`` and usage errors answer at once. Every
failure is one line on stderr, ``csf: <file>: <tensor>: <what>``, and an exit status from
:mod:`csf_codec.errors` (the ``--help`` epilog lists them).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED, CheckpointIOError, CSFError
from .units import human_bytes

__all__ = ["inspect_totals", "main"]


def _ratio(native: float, stored: float) -> float | None:
    return native / stored if stored else None


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.0f}%"


def inspect_totals(reports: Sequence[dict]) -> dict[str, object]:
    """Totals over :func:`inspect_checkpoint` reports; the entropy bound adds up as bytes (native / bound ratio)."""
    native = sum(r["native_bytes"] for r in reports)
    compact = sum(r["compact_bytes"] for r in reports)
    inline = sum(r["inline_bytes"] for r in reports)
    bound = sum(r["native_bytes"] / r["entropy_bound_ratio"] for r in reports if r["entropy_bound_ratio"])
    bound_ratio = _ratio(native, bound)
    compact_ratio, inline_ratio = _ratio(native, compact), _ratio(native, inline)
    exceptions = sum(r["exceptions"] for r in reports)
    return {
        "tensors": len(reports),
        "native_bytes": native,
        "compact_bytes": compact,
        "compact_ratio": compact_ratio,
        "inline_bytes": inline,
        "inline_ratio": inline_ratio,
        "exceptions": exceptions,
        "exception_fraction": exceptions / native if native else 0.0,
        "raw_tiles": sum(r["raw_tiles"] for r in reports),
        "tiles": sum(r["tiles"] for r in reports),
        "entropy_bound_bytes": bound,
        "entropy_bound_ratio": bound_ratio,
        "compact_efficiency": compact_ratio / bound_ratio if compact_ratio and bound_ratio else None,
        "inline_efficiency": inline_ratio / bound_ratio if inline_ratio and bound_ratio else None,
    }


def _efficiency(ratio: float | None, bound: float | None) -> float | None:
    return ratio / bound if ratio and bound else None


def _inspect_table(reports: Sequence[dict]) -> str:
    head = (
        "tensor",
        "fmt",
        "shape",
        "stored",
        "native",
        "compact",
        "inline",
        "exceptions",
        "raw tiles",
        "H b/scale",
        "bound",
        "compact/bound",
        "inline/bound",
    )
    rows = []
    for r in reports:
        rows.append(
            (
                r["name"],
                r["format"],
                "x".join(map(str, r["shape"])),
                r.get("stored", "native"),
                human_bytes(r["native_bytes"]),
                _x(r["compact_ratio"]),
                _x(r["inline_ratio"]),
                f"{r['exceptions']} ({100 * r['exception_fraction']:.2f}%)",
                f"{r['raw_tiles']}/{r['tiles']}",
                f"{r['entropy_bits_per_scale']:.3f}",
                _x(r["entropy_bound_ratio"]),
                _pct(_efficiency(r["compact_ratio"], r["entropy_bound_ratio"])),
                _pct(_efficiency(r["inline_ratio"], r["entropy_bound_ratio"])),
            )
        )
    t = inspect_totals(reports)
    bits = 8 / t["entropy_bound_ratio"] if t["entropy_bound_ratio"] else 0.0
    rows.append(
        (
            f"TOTAL ({t['tensors']} planes)",
            "",
            "",
            "",
            human_bytes(t["native_bytes"]),
            _x(t["compact_ratio"]),
            _x(t["inline_ratio"]),
            f"{t['exceptions']} ({100 * t['exception_fraction']:.2f}%)",
            f"{t['raw_tiles']}/{t['tiles']}",
            f"{bits:.3f}",
            _x(t["entropy_bound_ratio"]),
            _pct(t["compact_efficiency"]),
            _pct(t["inline_efficiency"]),
        )
    )
    widths = [max(len(str(x[i])) for x in (head, *rows)) for i in range(len(head))]

    def fmt_row(cells: Sequence[object]) -> str:  # text columns left-aligned, numbers right-aligned
        return "  ".join(
            str(c).ljust(w) if i < 4 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    lines = [fmt_row(head), "  ".join("-" * w for w in widths)]
    lines += [fmt_row(r) for r in rows[:-1]]
    lines += ["  ".join("-" * w for w in widths), fmt_row(rows[-1])]
    lines.append(
        f"compact total {human_bytes(t['compact_bytes'])}, inline total {human_bytes(t['inline_bytes'])}, "
        f"entropy bound {human_bytes(t['entropy_bound_bytes'])} (order-0 entropy of offsets from the row base)"
    )
    return "\n".join(lines)


def _cmd_compress(args: argparse.Namespace) -> int:
    from .checkpoint import compress_checkpoint

    s = compress_checkpoint(args.src, args.dst, device=args.device, progress=args.progress, overwrite=args.overwrite)
    for t in s.tensors:
        kept = " (kept native: not smaller compressed)" if t.stored == "native" else ""
        print(
            f"{t.name}: {t.fmt} {human_bytes(t.native_bytes)} -> {human_bytes(t.compact_bytes)} ({_x(t.ratio)}){kept}"
        )
    print(
        f"compressed {len(s.compressed)} scale planes: "
        f"{human_bytes(s.native_scale_bytes)} -> {human_bytes(s.compact_scale_bytes)} "
        f"({_x(_ratio(s.native_scale_bytes, s.compact_scale_bytes))}); {s.passthrough_tensors} tensors passed "
        f"through; checkpoint {human_bytes(s.native_total_bytes)} -> {human_bytes(s.csf_total_bytes)}; wrote {s.dst}"
    )
    if not s.tensors:
        print("note: no FP4 scale planes recognised; the output is a plain copy", file=sys.stderr)
    return 0


def _cmd_decompress(args: argparse.Namespace) -> int:
    from .checkpoint import decompress_checkpoint

    s = decompress_checkpoint(args.src, args.dst, device=args.device, progress=args.progress, overwrite=args.overwrite)
    print(
        f"restored {len(s.tensors)} scale planes "
        f"({human_bytes(s.compact_scale_bytes)} -> {human_bytes(s.native_scale_bytes)}), "
        f"{s.passthrough_tensors} tensors passed through; wrote {s.dst}"
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .checkpoint import verify_checkpoint

    s = verify_checkpoint(args.src, against=args.against, device=args.device, progress=args.progress)
    msg = (
        f"OK: {s.tensors} CSF tensors decode to their sealed digests "
        f"({human_bytes(s.compact_bytes)} -> {human_bytes(s.native_bytes)})"
    )
    if s.against is not None:
        msg += f"; all {s.compared_tensors} tensors byte-identical to {s.against}"
    print(msg)
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .checkpoint import inspect_checkpoint

    reports = inspect_checkpoint(args.src, device=args.device, progress=args.progress)
    if args.json:
        print(json.dumps({"tensors": reports, "totals": inspect_totals(reports)}, indent=2))
    elif not reports:
        print(f"{args.src}: no FP4 scale planes recognised")
    else:
        print(_inspect_table(reports))
    return 0


_EPILOG = """exit status:
  0    success
  1    integrity: a payload, digest, completion record or comparison does not check out
  2    usage: bad arguments; the destination exists (without --overwrite) or is the source
  3    malformed input: not a checkpoint this build reads (bad header, JSON, version, geometry)
  4    I/O error: reading or writing failed (no space, file too large, permissions)
  130  interrupted (SIGINT); 143 terminated (SIGTERM). Outputs are written under a temporary
       sibling (.NAME.csf-partial-PID) and renamed into place whole, so an interrupted run leaves
       the destination as it was.
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="csf",
        description="Lossless compressed FP4 block scales (CSF) for checkpoints.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default="cpu", help="torch device to encode/decode on (default: cpu)")
        p.add_argument("-q", "--quiet", "--no-progress", dest="progress", action="store_false", help="no progress bar")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)

    p = command("compress", "write a CSF copy of a native FP4 checkpoint")
    p.add_argument("src", help="checkpoint directory or .safetensors file")
    p.add_argument("dst", help="output directory (or .safetensors file for a single-file checkpoint)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing destination once the new one is complete"
    )
    common(p)
    p.set_defaults(run=_cmd_compress)

    p = command("decompress", "restore the native checkpoint from a CSF one, byte for byte")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing destination once the new one is complete"
    )
    common(p)
    p.set_defaults(run=_cmd_decompress)

    p = command("verify", "prove a CSF checkpoint whole and lossless; optionally compare with the native one")
    p.add_argument("src")
    p.add_argument("--against", metavar="NATIVE", help="native checkpoint that every tensor must match byte for byte")
    common(p)
    p.set_defaults(run=_cmd_verify)

    p = command("inspect", "per-plane sizes, ratios, exceptions and entropy bound (native or CSF)")
    p.add_argument("src")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    common(p)
    p.set_defaults(run=_cmd_inspect)
    return ap


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that cleanup runs as for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated()


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise (so partial outputs are removed) while a command runs; restored after."""
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        old = {}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _fail(e: CSFError) -> int:
    print(f"csf: {e}", file=sys.stderr)
    return e.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with _signals_raise():
            return args.run(args)
    except CSFError as e:
        return _fail(e)
    except OSError as e:
        return _fail(CheckpointIOError.from_os(e))
    except KeyboardInterrupt as e:
        terminated = isinstance(e, _Terminated)
        print(f"csf: {'terminated' if terminated else 'interrupted'}; no output was written", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
