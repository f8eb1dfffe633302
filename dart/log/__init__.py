"""The durable log: the archive of every topic (Avro files under RUN_DIR/log), the archiver that
writes it, and the broker rebuilt from it. Part of the kernel: any service may read an archive."""

from dart.log.segments import (
    ARCHIVE_SCHEMA,
    ArchiveError,
    Segment,
    list_segments,
    read_partition,
    read_segment,
)

__all__ = ["ARCHIVE_SCHEMA", "ArchiveError", "Segment", "list_segments", "read_partition", "read_segment"]
