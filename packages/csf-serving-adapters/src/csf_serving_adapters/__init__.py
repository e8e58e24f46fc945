"""csf-serving-adapters: vLLM and SGLang plugins that serve CSF checkpoints through csf-moe and
csf-attention.

Depends on every csf package below it. Not built yet: see the serving-adapters issue.
"""
