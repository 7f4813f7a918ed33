"""Tests against real third-party programs on loopback (the real Pi coding agent from npm)."""
