"""The restart: which checkpoint every rank resumes from, and its files on this node.

``resume`` (:mod:`.resume`) is the restart's one call, made by every rank at start-up (the
framework callbacks' ``resume()`` methods call it); the lookup (:mod:`.lookup`:
``latest_complete_checkpoint``, ``first_verified``; :mod:`.best` for the best by a metric) is what
it and a script without a process group use to ask the database. The rest is theirs: the walk over
complete checkpoints (:mod:`.walk`, :mod:`.shard_rows`), the decision (:mod:`.decide`), its
fixed-size collectives (:mod:`.wire`, :mod:`.wire_decision`), a change of world size
(:mod:`.world`), what a node fetches (:mod:`.node_share`, :mod:`.node_fetch`), the restart's
record (:mod:`.record`) and what it says (:mod:`.say`). Modules import psycopg and torch lazily or
at their own import only; this package imports none of them.
"""
