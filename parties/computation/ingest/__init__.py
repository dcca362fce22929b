"""Ingest processes: several server processes of one computation server behind its one port.

`serve-computation --ingest-processes N` starts N front processes that share the public port
(SO_REUSEPORT, the kernel spreads the connections); each receives, parses, checks and stores the
upload chunks that reach it, and forwards every other call to the coordinator, the process that
holds the releases, folds and workers, over a private Unix socket. docs/scaling.md, "Ingest on
several processes", has the design and its trust boundary.
"""
