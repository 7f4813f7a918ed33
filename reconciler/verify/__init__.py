"""Tools that talk to the served API: `reconciler smoke`, `reconciler bench` and their pictures.

They stand beside the spec -> facts -> plan -> apply chain, not in it: they judge the running
service from a client's side and manage nothing. The rank component gets the post-start
smoke handed in as a step rather than importing it, so the chain never depends on them.
"""
