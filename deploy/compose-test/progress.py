"""What the archive volume holds, as one JSON line: records per topic, the weight versions
published (in log order) and the trainer's last step. `make compose-test` runs it in the dart
image with the event-archive volume at /data/log: `python progress.py /data/log`."""

import json
import sys
from pathlib import Path

from dart.events.codec import decode
from dart.log.segments import list_segments, read_partition


def main(log_dir: str) -> None:
    records: dict[str, int] = {}
    versions: list[int] = []
    for (topic, _partition), segs in sorted(list_segments(Path(log_dir)).items()):
        for rec in read_partition(segs):
            records[topic] = records.get(topic, 0) + 1
            if topic.endswith(".weights") and rec["event_type"] == "WeightsPublished":
                versions.append(decode(rec["value"]).version)
    print(json.dumps({"records": sum(records.values()), "topics": records, "weights": versions}))


if __name__ == "__main__":
    main(sys.argv[1])
