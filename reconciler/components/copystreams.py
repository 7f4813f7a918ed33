"""How a copy to a worker is split into parallel rsync streams, and what each stream's ssh is told.

One rsync over SSH is paced by its slowest single-threaded stage: the cipher in `ssh`/`sshd`
or rsync's own checksum and I/O loop, about one core each, far below the fabric (25 GB/s) and
the NVMe (5-7 GB/s). Several streams at once use several cores. The files are dealt to the
streams biggest first, each to the stream with the fewest bytes so far (longest processing
time first): the shards spread over the streams, the many small EXL3 files fill the gaps, and
the streams end close together, so the copy's tail is short.
"""

from __future__ import annotations

# Beyond this the NVMe, not the CPU, is the limit: about 1 GB/s per stream, 5-7 GB/s of disk.
MAX_STREAMS = 8

# AES-GCM runs on the CPU's AES instructions (x86 AES-NI, Arm's crypto extension on the Spark)
# and needs no separate MAC, several times the rate of OpenSSH's first default choice,
# chacha20-poly1305. `^` puts them first in the default list, so a server without them still
# negotiates the rest; the route's other options are untouched.
CIPHER_OPTION = "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


def stream_count(cores: int | None, files: int) -> int:
    """One stream per core of the node that runs them (the head), within [1, MAX_STREAMS] and
    never more than there are files."""
    wanted = min(max(cores or 1, 1), MAX_STREAMS)
    return max(1, min(wanted, files))
