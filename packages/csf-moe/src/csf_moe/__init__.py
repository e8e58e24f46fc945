"""csf-moe: mixture-of-experts planning, weight preparation (inline CSF scale storage) and fused
execution on Hopper, reading compressed FP4 block scales inline.

Depends on csf-codec and csf-kernels. Not built yet: see the fused-MoE issue.
"""
