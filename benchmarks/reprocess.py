"""What a backfill after the curation grew costs a publish: re-processing one file whose runs were
uncurated, against adding a new file, into the same index, against the embedded S3 (SeaweedFS).

Ingests --files Liger CSVs of --rows rows of the shared CSV (each its own publish), half of each
file's rows measured on a GPU the curation lacks (uncurated runs). Then, the baseline: --repeats
new files of the same shape, each its own publish. Then the curation learns the GPU and
--repeats of the first files are processed again, each its own publish: their uncurated runs
leave the index (pipelines/index/publish.py, find_stale). Prints the median publish of each,
their ratio (target <= 2x: a re-processed file costs about what a new one does), and the runs
and uncurated runs before and after.

    python benchmarks/reprocess.py [--files 60] [--rows 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

UNCURATED = "manifest->>'$.metadata.labels.curation' = 'uncurated'"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=60)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from importlib import resources

    from index_support import NEW_GPU, add_new_gpu, csv_bytes, drop_and_process, liger_rows, query

    from pipelines.curation import CURATION_DIR_VARIABLE, CURATION_FILES
    from pipelines.index.publish import publish_index
    from pipelines.settings import Settings
    from pipelines.storage.embedded import start_on_free_ports
    from pipelines.storage.s3 import S3Store

    header, rows = liger_rows(range(2, 2449))
    gpu = header.index("gpu_name")
    root = Path(tempfile.mkdtemp(prefix="kindex-reprocess-"))
    curation = root / "curation"
    curation.mkdir()
    for name in CURATION_FILES:
        text = resources.files("pipelines.curation").joinpath(name).read_text(encoding="utf-8")
        (curation / name).write_text(text)
    os.environ[CURATION_DIR_VARIABLE] = str(curation)
    server = start_on_free_ports(root / "s3")
    try:
        store = S3Store(
            f"reprocess-{uuid.uuid4().hex[:8]}",
            endpoint_url=server.endpoint_url,
            credentials=server.credentials,
        )
        store.ensure_bucket()
        settings = Settings(
            home=root / "home", s3_endpoint=server.endpoint_url, bucket=store.bucket
        )

        def file(i: int) -> tuple[str, bytes]:
            start = (i * args.rows) % (len(rows) - args.rows)
            chosen = [list(r) for r in rows[start : start + args.rows]]
            for r in chosen[::2]:
                r[gpu] = NEW_GPU
            return f"incoming/f{i:05}.csv", csv_bytes(header, chosen)

        def published(key: str, data: bytes) -> float:
            drop_and_process(store, settings, key, data)
            began = time.perf_counter()
            publish_index(store, settings)
            return time.perf_counter() - began

        files = [file(i) for i in range(args.files)]
        for key, data in files:
            published(key, data)
        counts = f"SELECT count(*), count(*) FILTER (WHERE {UNCURATED}) FROM runs"
        before = query(settings, counts)[0]
        new = [published(*file(args.files + i)) for i in range(args.repeats)]
        grown = query(settings, counts)[0]
        add_new_gpu(curation)
        again = [published(key, data) for key, data in files[: args.repeats]]
        after = query(settings, counts)[0]
        new_median, again_median = statistics.median(new), statistics.median(again)
        print(f"index of {args.files} files x {args.rows} rows: runs, uncurated {before}")
        print(f"publish of a new file: median {new_median:.3f} s of {args.repeats}")
        print(f"after {args.repeats} new files: runs, uncurated {grown}")
        print(
            f"publish of a re-processed file: median {again_median:.3f} s of {args.repeats} "
            f"({again_median / new_median:.2f}x the new file's)"
        )
        print(f"after re-processing {args.repeats} files: runs, uncurated {after}")
        # Each re-processed file's uncurated runs left; its curated ones took their place.
        replaced = args.repeats * ((args.rows + 1) // 2)
        return 0 if after == (grown[0], grown[1] - replaced) else 1
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
