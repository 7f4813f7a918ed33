"""Observed state, as plain data.

Each module pairs a domain's facts model with the pure parsers of the real command output
it is built from (the pyinfra model). Gatherers that run commands on nodes build these;
`plan` only ever reads them, so a facts snapshot saved as JSON replays a plan offline.
"""
