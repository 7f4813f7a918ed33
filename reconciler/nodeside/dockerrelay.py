"""Runs ON a node (stdlib only): pipe stdin/stdout to the Docker socket, end when stdin ends.

Used instead of `docker system dial-stdio`, which lingers after its client went away (it
waits for dockerd to close a keep-alive connection), so each finished Docker connection
kept one SSH session open until sshd's MaxSessions (10) refused new ones.
"""

import os
import socket
import threading

host = os.environ.get("DOCKER_HOST", "")
path = host[len("unix://") :] if host.startswith("unix://") else "/var/run/docker.sock"
docker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
docker.connect(path)


def upstream() -> None:
    while data := os.read(0, 65536):
        docker.sendall(data)
    os._exit(0)


threading.Thread(target=upstream, daemon=True).start()
while data := docker.recv(65536):
    os.write(1, data)
os._exit(0)
