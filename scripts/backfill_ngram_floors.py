"""Add the n-gram floors to run records made before runs kept them (``ngram_floors``), so a
shipped table's caption can name them: the records' own corpus (``data.path``) split as xbench
splits it, at each record's window -- what a run of today records itself.

    python scripts/backfill_ngram_floors.py results/reference/narang_table1_300_steps_tinyshakespeare/records

Records of other data, records that already keep floors, and records whose corpus is not on this
machine are left as they are (named); the run id and every measured value are unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from xformer_bench.registry import DATA
from xformer_bench.results.record import write_json_atomic
from xformer_bench.results.ngram_floors import run_floors
from xformer_bench.run import FLOOR_DATASETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, nargs="+", help="folders of run records")
    parser.add_argument("--cache", type=Path, default=Path("data/ngram_floors"))
    args = parser.parse_args(argv)
    computed: dict[tuple[str, int], dict] = {}
    for folder in args.records:
        for path in sorted(folder.rglob("*.json")):
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or "config" not in record or record.get("ngram_floors"):
                continue
            data = record["config"]["data"]
            if data["name"] not in FLOOR_DATASETS:
                continue
            if not Path(str(data.get("path"))).is_file():
                print(f"skipped {path}: its corpus {data.get('path')} is not here")
                continue
            key = (str(data["path"]), int(data["seq_len"]))
            if key not in computed:
                module = DATA.build(data, seed=record["seed"], data_dir=str(args.cache.parent))
                computed[key] = run_floors(module.splits, key[1], args.cache)
                print(f"{key[0]} at {key[1]}-byte windows: {computed[key]['bits_per_byte']}")
            write_json_atomic(path, {**record, "ngram_floors": computed[key]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
