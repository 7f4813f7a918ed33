"""Developer tools beside the package (not shipped)."""
