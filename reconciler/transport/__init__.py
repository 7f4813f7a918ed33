"""How the reconciler reaches a node: a local machine or an SSH target.

One transport per node per pass: commands, stdin-fed programs and the Docker API all travel
over it (for SSH: one authenticated connection, several channels).
"""

from reconciler.transport.base import CommandResult, Transport
from reconciler.transport.connect import close_all, connect_all, transport_for

__all__ = ["CommandResult", "Transport", "close_all", "connect_all", "transport_for"]
