"""The real-engine lane: the reconciler drives real vLLM (CPU build) ranks on the testbed."""
