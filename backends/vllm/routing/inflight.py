"""The gateway's calls in flight per pool endpoint, shared by the N worker processes of ``--workers N``.

Least-load routing must see the whole gateway, not one worker's share of it. The control
process creates one table per pool: ``rows`` (one per gateway worker) x ``cols`` (one per pool
endpoint) 64-bit cells in a shared file mapping (``/dev/shm`` where it exists). Gateway worker
K writes only row K, and only the count it keeps anyway (a plain store of its own value, never a
read-modify-write of a shared cell); readers sum a column. So there is no lock and no message
per request: a begin/end costs one aligned 8-byte store, a pick one N-cell column sum per
candidate. A reader may see a row one call stale; for a load figure that is fine.

A worker that restarts zeroes its row when it attaches: the calls of its dead predecessor
died with it. The table is a file (``mmap``), not ``multiprocessing.shared_memory``: on Python
3.11 attaching to one registers it with a resource-tracker process that unlinks it when the
attaching worker exits, and starts that tracker as an extra child of every process.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from backends.vllm.routing.balancer import Endpoint

__all__ = ["InFlightTable", "SharedEndpoint"]

_CELL = 8  # bytes: one signed 64-bit count


class InFlightTable:
    """``rows`` x ``cols`` int64 counts in a shared mapping of the file at ``path``."""

    def __init__(self, path: Path, rows: int, cols: int, *, create: bool = False) -> None:
        self.path = path
        self.rows = rows
        self.cols = cols
        size = max(1, rows * cols) * _CELL
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)  # zero-filled
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"in-flight table {path} is smaller than {rows}x{cols}")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)  # the mapping keeps the file
        self.cells = memoryview(self._map).cast("q")

    def column(self, col: int) -> int:
        """Calls in flight to endpoint ``col`` from every gateway worker."""
        return sum(self.cells[col :: self.cols])

    def row(self, row: int) -> list[int]:
        start = row * self.cols
        return list(self.cells[start : start + self.cols])

    def clear_row(self, row: int) -> None:
        start = row * self.cols
        for i in range(start, start + self.cols):
            self.cells[i] = 0

    def close(self) -> None:
        self.cells.release()
        self._map.close()


class SharedEndpoint(Endpoint):
    """An endpoint whose in-flight count is published in row ``row`` of a table, and whose
    load (``gateway_in_flight``) is the whole gateway's column sum."""

    __slots__ = ("_cell", "_col", "_table")

    def __init__(
        self, index: int, affinity_entries: int, table: InFlightTable | None, row: int, index_blocks: int = 1
    ) -> None:
        super().__init__(index, affinity_entries, index_blocks=index_blocks)
        # An endpoint past the table's columns (the pool grew) counts for this worker only.
        self._table = table if table is not None and index < table.cols and row < table.rows else None
        self._col = index
        self._cell = row * table.cols + index if self._table is not None and table is not None else 0

    def begin(self) -> None:
        self.in_flight += 1
        if self._table is not None:
            self._table.cells[self._cell] = self.in_flight

    def end(self) -> None:
        self.in_flight -= 1
        if self._table is not None:
            self._table.cells[self._cell] = self.in_flight

    @property
    def gateway_in_flight(self) -> int:
        table = self._table
        return self.in_flight if table is None else sum(table.cells[self._col :: table.cols])
