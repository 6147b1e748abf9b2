"""One checkpoint's shard rows as the resume walk reads them: a few aggregated texts, decoded into
:class:`ShardRecord` objects only when something asks for them.

Why not one row per shard: at 100,000 ranks the rows cost more than the decision they serve:
per shard row the server sends a row and psycopg builds a tuple and one object per column, and the
helper built a record per shard before anything asked for one. Here the shard rows' count, first
and last rank, and one text per column are joined in one aggregate pass: the n-th item of every
text is of the same shard row, whatever order the rows came in (a parallel plan combines each
worker's partial states of every aggregate together). Nothing is decoded until a caller reads the
records, the URIs or the path, and the path of a checkpoint whose ranks all reported one URI (a
DCP or Lightning save) needs none of them.

Where the texts come from: the checkpoint's manifest (migration 0013), built by the writer's
settle when it marks the attempt complete, in rows of 10,000 ranks whose texts the client joins
(:meth:`ShardRows.from_chunks`); or, where it has none of the row's attempt and world size (or
the role may not read the manifests), the aggregates computed from the shard rows in the server
(:data:`SHARD_AGGREGATES`, the same expressions), linear in the ranks: the index range and its
heap rows, and jsonb's output of every row's pins (``objects::text``), the largest part.
Figures: BENCHMARKS.md, "Read paths at 100,000 shards".

The texts are joined by ``,`` (ranks, sizes, SHA-256s; pins and extras are JSON values) and by a
newline (URIs); an absent size or SHA-256 is an empty item (the contract's SHA-256 is 64 hex
digits, never empty). A URI holding a newline or a SHA-256 holding a comma (no report the contract
accepts has one; a row written by hand may) would split into more items than rows: such a
checkpoint's rows are read one per row instead (:data:`SHARD_ROWS`). The checks run in the client
on the joined texts (one pass of ``str.count`` each), not per row in the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

from trainer_client._gc import cycle_collection_paused
from trainer_client.storage.verify import ShardRecord

# The aggregates of the shard rows of one checkpoint attempt, for a query whose FROM names the
# checkpoint as ``c`` (step, run_attempt) and binds %(job_id)s: a LATERAL subquery, so one index
# range of the shards' primary key per checkpoint, as one row per shard read it. The same
# expressions build the manifests (migration 0013, ckpt_build_manifest).
SHARD_AGGREGATES = """
CROSS JOIN LATERAL (
    SELECT count(*)::integer, min(s.rank), max(s.rank),
           string_agg(s.rank::text, ','),
           string_agg(s.uri, E'\\n'),
           string_agg(coalesce(s.size_bytes::text, ''), ','),
           string_agg(coalesce(s.sha256, ''), ','),
           string_agg(coalesce(s.objects, s.extra->'objects', 'null'::jsonb)::text, ','),
           string_agg(s.rank::text, ',') FILTER (WHERE s.extra <> '{}'::jsonb),
           string_agg(s.extra::text, ',') FILTER (WHERE s.extra <> '{}'::jsonb)
    FROM training_checkpoint_shards s
    WHERE s.job_id = %(job_id)s AND s.step = c.step AND s.run_attempt = c.run_attempt
) a
"""

# SHARD_AGGREGATES of one checkpoint attempt named by %(step)s and %(run_attempt)s.
SHARD_AGGREGATES_OF = (
    "SELECT a.* FROM (SELECT %(step)s::bigint, %(run_attempt)s::integer) c(step, run_attempt)"
    + SHARD_AGGREGATES
)

# The checkpoint's manifest (migration 0013: SHARD_AGGREGATES' texts, built in chunks of ranks by
# the settle that marked the attempt complete), for a query whose FROM names the checkpoint as
# ``c`` (step, run_attempt, world_size): one row per chunk, or one row of NULLs where it has no
# manifest of the row's attempt and world size (completed before 0013, or a shard row changed
# since): then :data:`SHARD_AGGREGATES_OF` reads the shard rows (:func:`shard_rows`).
MANIFEST_CHUNKS = """
LEFT JOIN training_checkpoint_manifests m
  ON m.job_id = %(job_id)s AND m.step = c.step AND m.run_attempt = c.run_attempt
 AND m.world_size = c.world_size
"""
MANIFEST_COLUMNS = (
    "m.chunk, m.chunks, m.shard_count, m.first_rank, m.last_rank, m.ranks, m.uris, m.sizes,"
    " m.shas, m.pins, m.extra_ranks, m.extras"
)

# One checkpoint attempt's shard rows, one row each: for a checkpoint that is not "plain".
SHARD_ROWS = """
SELECT s.rank, s.uri, s.size_bytes, s.sha256,
       coalesce(s.objects, s.extra->'objects')::text, s.extra::text
FROM training_checkpoint_shards s
WHERE s.job_id = %(job_id)s AND s.step = %(step)s AND s.run_attempt = %(run_attempt)s
ORDER BY s.rank
"""


class ShardRows(Mapping[int, ShardRecord]):
    """A checkpoint attempt's shard rows by rank, from :data:`SHARD_AGGREGATES`' columns;
    decoded on first use."""

    count: int
    first_rank: int | None
    last_rank: int | None
    # ranks, URIs, sizes, SHA-256s, pins, the ranks with extras, their extras (None: no rows)
    _texts: list[Any]

    def __init__(self, aggregates: tuple[Any, ...]) -> None:
        self.count, self.first_rank, self.last_rank, *self._texts = aggregates

    @classmethod
    def from_chunks(cls, chunks: list[tuple[Any, ...]]) -> ShardRows | None:
        """From a manifest's rows (:data:`MANIFEST_COLUMNS`, any order), or None where they are
        not one whole build (no manifest: a row of NULLs; a chunk missing)."""
        if not chunks or chunks[0][0] is None or len(chunks) != chunks[0][1]:
            return None
        chunks = sorted(chunks, key=lambda chunk: int(chunk[0]))
        # Each chunk's texts hold one item per row of it, so joining every column's chunks in
        # the same order keeps the n-th items together (the extras only where a chunk has any).
        columns = list(zip(*(chunk[2:] for chunk in chunks), strict=True))
        count, firsts, lasts = columns[0], columns[1], columns[2]
        separators = (",", "\n", ",", ",", ",", ",", ",")
        texts = [
            sep.join(text for text in column if text is not None)
            if any(text is not None for text in column)
            else None
            for sep, column in zip(separators, columns[3:], strict=True)
        ]
        present = [x for x in firsts if x is not None]
        return cls(
            (
                sum(count),
                min(present) if present else None,
                max(x for x in lasts if x is not None) if present else None,
                *texts,
            )
        )

    @property
    def plain(self) -> bool:
        """Whether the texts hold exactly one item per row (see the module docstring)."""
        if not self.count or not self._texts:
            return True
        splits = self.count - 1
        _, uris, _, shas, *_ = self._texts
        return bool(uris.count("\n") == splits and shas.count(",") == splits)

    @classmethod
    def from_rows(cls, rows: list[tuple[Any, ...]]) -> ShardRows:
        """From :data:`SHARD_ROWS`' rows (JSON columns as text)."""
        self = cls.__new__(cls)
        self.count = len(rows)
        ranks = [r[0] for r in rows]
        self.first_rank, self.last_rank = (min(ranks), max(ranks)) if rows else (None, None)
        self._texts = []
        objects = json.loads("[" + ",".join(r[4] or "null" for r in rows) + "]")
        extras = json.loads("[" + ",".join(r[5] or "null" for r in rows) + "]")
        self.__dict__["records"] = {
            r[0]: ShardRecord(r[0], r[1], r[2], r[3], o, e or {})
            for r, o, e in zip(rows, objects, extras, strict=True)
        }
        return self

    def ranks_are(self, world_size: int) -> bool:
        """Whether the rows are exactly ranks 0 .. world_size - 1 (ranks are unique: the key)."""
        return self.count == world_size and (
            world_size == 0 or (self.first_rank == 0 and self.last_rank == world_size - 1)
        )

    @cached_property
    def one_uri(self) -> str | None:
        """The URI every rank reported, or None when they differ (or there are no rows)."""
        if not self.count:
            return None
        if not self._texts:
            uris = {shard.uri for shard in self.records.values()}
            return uris.pop() if len(uris) == 1 else None
        joined = self._texts[1]
        first = joined.partition("\n")[0]
        # One comparison in C of the joined text with the first URI repeated: no list of URIs.
        return first if joined == "\n".join([first] * self.count) else None

    @cached_property
    def records(self) -> dict[int, ShardRecord]:
        """Every row as a :class:`ShardRecord`, by rank (decoded now, once)."""
        if not self.count:
            return {}
        ranks_text, uris_text, sizes_text, shas_text, pins_text, extra_ranks, extras_text = (
            self._texts
        )
        with cycle_collection_paused():  # a record and its pins per row: see trainer_client/_gc.py
            ranks = [int(x) for x in ranks_text.split(",")]
            uris = uris_text.split("\n")
            sizes = [int(x) if x else None for x in sizes_text.split(",")]
            shas = [x or None for x in shas_text.split(",")]
            objects = json.loads("[" + pins_text + "]")
            extras: dict[int, Any] = {}
            if extra_ranks:
                extras = dict(
                    zip(
                        (int(x) for x in extra_ranks.split(",")),
                        json.loads("[" + extras_text + "]"),
                        strict=True,
                    )
                )
            return {
                rank: ShardRecord(rank, uri, size, sha, pins, extras.get(rank) or {})
                for rank, uri, size, sha, pins in zip(
                    ranks, uris, sizes, shas, objects, strict=True
                )
            }

    def may_hold(self, text: str) -> bool:
        """Whether some row's extra may contain ``text`` (False: none does; True: decode the
        records to know): one search of the joined extras, nothing decoded."""
        if self._texts:
            extras = self._texts[6]
            return extras is not None and text in extras
        return any(text in json.dumps(shard.extra) for shard in self.records.values())

    @cached_property
    def uris(self) -> Mapping[int, str]:
        """Each rank's URI (decoded on first use)."""
        return RankUris(self)

    def __getitem__(self, rank: int) -> ShardRecord:
        return self.records[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.records)

    def __len__(self) -> int:
        return int(self.count)

    def __repr__(self) -> str:
        return f"ShardRows({self.count} rows, ranks {self.first_rank}..{self.last_rank})"


class RankUris(Mapping[int, str]):
    """Each rank's URI of a :class:`ShardRows`, decoded when first read (a ``ResumePoint``'s
    ``uris``: at 100,000 ranks most resumes never read them)."""

    def __init__(self, rows: ShardRows) -> None:
        self._rows = rows

    @cached_property
    def _uris(self) -> dict[int, str]:
        rows = self._rows
        if not rows.count:
            return {}
        if rows._texts and "records" not in rows.__dict__:
            ranks = (int(x) for x in rows._texts[0].split(","))
            return dict(zip(ranks, rows._texts[1].split("\n"), strict=True))
        return {rank: shard.uri for rank, shard in rows.records.items()}

    def __getitem__(self, rank: int) -> str:
        return self._uris[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._uris)

    def __len__(self) -> int:
        return int(self._rows.count)

    def __repr__(self) -> str:
        return repr(self._uris)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a restart's decision crosses processes) as the plain dict it stands for.
        return (dict, (self._uris,))
