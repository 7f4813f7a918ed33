"""How the reconciler reaches a node: a local machine or an SSH target.

One transport per node per pass: commands, stdin-fed programs and the Docker API all travel
over it (for SSH: one authenticated connection, several channels).

Opening one (reconciler.transport.connect) imports paramiko and docker; this package's
`__init__` does not, so code that only plans (and names `base.Transport` in its types) stays light.
"""
