"""What a worker's memory grew by between two tracemalloc snapshots, per connection.

``python -m tools.memory_diff DIR/before.snapshot DIR/connected.snapshot --per 2000 [--top 25]``
(snapshots from ``python -m bench.sse --profile-worker DIR`` with ``PROFILE_WORKER_TRACEMALLOC=1``).
"""

from __future__ import annotations

import argparse
import tracemalloc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\\n\\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--per", type=int, default=1, help="divide by this many connections")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--group", choices=("lineno", "traceback", "filename"), default="lineno")
    args = parser.parse_args(argv)
    before = tracemalloc.Snapshot.load(args.before)
    after = tracemalloc.Snapshot.load(args.after)
    diffs = after.compare_to(before, args.group)
    total = sum(diff.size_diff for diff in diffs)
    print(f"total growth {total / 1024:.0f} KiB, {total / args.per / 1024:.2f} KiB per connection")
    for diff in diffs[: args.top]:
        where = diff.traceback.format(limit=4 if args.group == "traceback" else 1)
        print(f"{diff.size_diff / args.per:9.0f} B {diff.count_diff / args.per:6.2f} blocks  " + " | ".join(where))


if __name__ == "__main__":
    main()
