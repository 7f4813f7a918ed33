"""The testbed: DGX Spark "nodes" as Linux namespaces on one machine, each with sshd and dockerd.

Stdlib only, so it runs with the system python3 before any venv exists. CLI:
`python3 -m tests.testbed {install,up,down,exec,link,image-ref,rebuild-engine}`;
Python API: `tests.testbed.testbed.Testbed`.
"""
