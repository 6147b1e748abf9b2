"""Samples ``pg_stat_activity`` to report the peak number of connections a run really opened."""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType

import psycopg

_SAMPLE_SQL = """
SELECT coalesce(nullif(application_name, ''), usename, '?'), count(*)
FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'
GROUP BY 1
"""


class PeakConnections:
    """Background sampler of client connections to one database; use as a context manager."""

    def __init__(self, database_url: str, *, interval_s: float = 0.02) -> None:
        self._url = database_url
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-connections", daemon=True)
        self._lock = threading.Lock()
        self.peak_total = 0
        self.peak_by_application: Counter[str] = Counter()
        self.samples = 0

    def __enter__(self) -> PeakConnections:
        self._conn = psycopg.connect(self._url, autocommit=True, application_name="ckpt-monitor")
        self._dbname = self._conn.info.dbname
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()

    def peak(self, application_name: str) -> int:
        """The highest number of simultaneous connections seen with this application_name."""
        with self._lock:
            return self.peak_by_application.get(application_name, 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = self._conn.execute(_SAMPLE_SQL, (self._dbname,)).fetchall()
            with self._lock:
                self.samples += 1
                self.peak_total = max(self.peak_total, sum(int(n) for _, n in rows))
                for app, n in rows:
                    self.peak_by_application[str(app)] = max(
                        self.peak_by_application[str(app)], int(n)
                    )
            self._stop.wait(self._interval_s)
