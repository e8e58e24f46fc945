"""csf-attention: DeepSeek-style sparse MLA decode over an FP8 KV cache on Hopper.

Depends on csf-codec and csf-kernels. Not built yet: see the sparse-MLA issue.
"""
