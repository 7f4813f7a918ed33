"""The Pi coding agent's configurator: `reconciler pi install|uninstall|status`.

Editing Pi's JSONC config in place, the record of what install added, and finding or
installing Pi with npm live here, apart from the chain. The chain's own view of Pi is
`facts/pi.py` (what the files say) and `components/pi.py` (what differs, and the step that
writes it), both built on `config.py`.
"""
