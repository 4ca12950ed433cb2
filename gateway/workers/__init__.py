"""``gateway serve --workers N``: one control process, N worker processes on one listening socket.

- :mod:`gateway.workers.control`: binds the socket, starts/restarts workers, forwards signals,
  merges metrics;
- :mod:`gateway.workers.worker`: one worker's entry (``python -m gateway worker``);
- :mod:`gateway.workers.channel`: the Unix-socket channel between them;
- :mod:`gateway.workers.merge`: metric snapshots and their merge;
- :mod:`gateway.workers.caps`: gateway-wide caps divided among the workers;
- :mod:`gateway.workers.cpus`: what ``--workers auto`` means.
"""
