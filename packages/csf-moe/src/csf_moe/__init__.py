"""csf-moe: mixture-of-experts planning, weight preparation (inline CSF scale storage) and fused
execution on Hopper, reading compressed FP4 block scales inline.

Depends on csf-codec and csf-kernels. Built so far: :mod:`csf_moe.routing` (the engines' top-k
routing) and :mod:`csf_moe.reference` (the float32 layer every kernel is tested against). Planning,
preparation and the fused kernels come with the fused-MoE issue.
"""
