"""csf-codec: CSF, lossless compressed FP4 block scales.

MXFP4 (E8M0 per 32 weights) and NVFP4 (E4M3 per 16 weights) scale planes cluster tightly per row;
CSF stores each row's base byte plus small offsets, exceptions and raw fallbacks, in two forms:

* the *compact* form (:mod:`csf_codec.compact`), smallest, for checkpoints and bulk expansion;
* the *inline* form (:mod:`csf_codec.inline`), fixed-size tile records a Hopper GEMM stage decodes.

Both encoders verify by decoding; both decoders validate every byte they use, and every payload
carries the SHA-256 of its native plane, checked on decode (:mod:`csf_codec.payloads`). ``docs/csf-format.md``
is the normative description. No GPU is needed; a CUDA plane is encoded on its device, bit-identically.
"""

from importlib import import_module

# Names are imported on first use (PEP 562): ``csf --help`` and the error types must not pay for torch.
_EXPORTS = {
    "CSF_FORMAT_VERSION": "container",
    "MXFP4": "formats",
    "NVFP4": "formats",
    "CSFError": "errors",
    "CompactScales": "compact",
    "CorruptPayloadError": "errors",
    "FormatVersionError": "errors",
    "InlineScales": "inline",
    "PlaneReport": "stats",
    "ScaleFormat": "formats",
    "ShapeMismatchError": "errors",
    "VerificationError": "errors",
    "decode_compact": "payloads",
    "decode_inline": "inline",
    "decode_payload": "payloads",
    "encode_compact": "compact",
    "encode_inline": "inline",
    "encode_verified": "verify",
    "inline_from_payload": "payloads",
    "plane_report": "stats",
    "read_compact_header": "compact",
    "scale_format": "formats",
    "verify": "verify",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'csf_codec' has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
