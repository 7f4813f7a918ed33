"""TEST STAND-IN assets for running a real (CPU) vLLM in tests; not part of the product."""
