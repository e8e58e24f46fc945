"""csf-codec: CSF, lossless compressed FP4 block scales.

MXFP4 (E8M0 per 32 weights) and NVFP4 (E4M3 per 16 weights) scale planes cluster tightly per row;
CSF stores each row's base byte plus small offsets, exceptions and raw fallbacks, in two forms:

* the *compact* form (:mod:`csf_codec.compact`), smallest, for checkpoints and bulk expansion;
* the *inline* form (:mod:`csf_codec.inline`), fixed-size tile records a Hopper GEMM stage decodes.

Both encoders verify by decoding; both decoders validate every byte they use, and every payload
carries the SHA-256 of its native plane, checked on decode (:mod:`csf_codec.payloads`). ``docs/csf-format.md``
is the normative description. No GPU is needed; a CUDA plane is encoded on its device, bit-identically.
"""

from .compact import CompactScales, encode_compact, read_compact_header
from .container import CSF_FORMAT_VERSION
from .errors import CorruptPayloadError, CSFError, FormatVersionError, ShapeMismatchError, VerificationError
from .formats import MXFP4, NVFP4, ScaleFormat, scale_format
from .inline import InlineScales, decode_inline, encode_inline
from .payloads import decode_compact, decode_payload, inline_from_payload
from .stats import PlaneReport, plane_report
from .verify import encode_verified, verify

__all__ = [
    "CSF_FORMAT_VERSION",
    "MXFP4",
    "NVFP4",
    "CSFError",
    "CompactScales",
    "CorruptPayloadError",
    "FormatVersionError",
    "InlineScales",
    "PlaneReport",
    "ScaleFormat",
    "ShapeMismatchError",
    "VerificationError",
    "decode_compact",
    "decode_inline",
    "decode_payload",
    "encode_compact",
    "encode_inline",
    "encode_verified",
    "inline_from_payload",
    "plane_report",
    "read_compact_header",
    "scale_format",
    "verify",
]
