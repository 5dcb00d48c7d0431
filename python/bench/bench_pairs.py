"""Reserve+complete pairs per second from Python, with the ratios the issue asks
for, all measured in one run:

- in process (``Limiter``) against the same pairs in the Rust library (the
  binding's overhead) and against ``aiolimiter`` / ``pyrate-limiter`` (request
  counting only: the floor of what a Python limiter costs);
- with ``--remote URL``: the remote limiter (sync, one pair after the other)
  against the same through the Rust ``HttpClient``.

Run from the repository root in a venv holding the package, aiolimiter and
pyrate-limiter:  python python/bench/bench_pairs.py [--remote http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import time
from typing import Callable, Dict, List, Optional, Tuple

from llm_ratelimiter import LimitDefinition, Limiter, RemoteLimiter

#: Far above what a run reserves, so every reserve is granted.
CAPACITY_UNLIMITED = 1 << 50
#: Pairs per in-process measurement: about a second each.
PAIRS_IN_PROCESS = 200_000
#: Pairs per remote measurement: each is two HTTP round trips.
PAIRS_REMOTE = 10_000
#: Repetitions; the best is reported (the machine is shared).
RUNS = 3


def definitions(model: str) -> List[LimitDefinition]:
    return [
        LimitDefinition.rolling(f"global:llm:bench:{model}:rpm", CAPACITY_UNLIMITED, 61),
        LimitDefinition.rolling(f"global:llm:bench:{model}:tpm", CAPACITY_UNLIMITED, 61),
        LimitDefinition.concurrency(f"global:llm:bench:{model}:concurrency", CAPACITY_UNLIMITED, 300),
        LimitDefinition.rolling("tenant:bench:llm:daily_tokens", CAPACITY_UNLIMITED, 86_400),
    ]


def shape(model: str) -> Tuple[List[Tuple[str, int]], List[Tuple[str, int]]]:
    keys = [d.key for d in definitions(model)]
    return list(zip(keys, [1, 1_200, 1, 1_200])), [(keys[1], 700), (keys[3], 700)]


def best_rate(measure: Callable[[int], float], pairs: int) -> float:
    return max(pairs / measure(pairs) for _ in range(RUNS))


def limiter_pairs(limiter, model: str) -> Callable[[int], float]:
    requirements, actuals = shape(model)

    def run(pairs: int) -> float:
        reserve, complete = limiter.reserve, limiter.complete
        started = time.perf_counter()
        for _ in range(pairs):
            lease = reserve(requirements)
            complete(lease.lease_id, actuals)
        return time.perf_counter() - started

    return run


def aiolimiter_acquires(pairs: int) -> float:
    from aiolimiter import AsyncLimiter

    async def main() -> float:
        limiter = AsyncLimiter(CAPACITY_UNLIMITED, 60)
        started = time.perf_counter()
        for _ in range(pairs):
            async with limiter:
                pass
        return time.perf_counter() - started

    return asyncio.run(main())


def pyrate_acquires(pairs: int) -> float:
    from pyrate_limiter import Duration, Limiter as PyrateLimiter, Rate

    limiter = PyrateLimiter(Rate(CAPACITY_UNLIMITED, Duration.MINUTE))
    started = time.perf_counter()
    for _ in range(pairs):
        limiter.try_acquire("bench")
    return time.perf_counter() - started


def rust_reference(remote: Optional[str]) -> Dict[str, float]:
    command = ["cargo", "run", "-q", "--release", "-p", "ratelimiter", "--example", "pairs", "--",
               str(PAIRS_IN_PROCESS)] + ([remote] if remote else [])
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
    return {name: float(value) for name, value in re.findall(r"(\w+)_pairs_per_s=(\d+)", output)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", help="a running ratelimiterd, e.g. http://127.0.0.1:8080")
    args = parser.parse_args()

    rust = rust_reference(args.remote)
    memory = Limiter(definitions("py"))
    python = best_rate(limiter_pairs(memory, "py"), PAIRS_IN_PROCESS)
    aio = best_rate(aiolimiter_acquires, PAIRS_IN_PROCESS)
    pyrate = best_rate(pyrate_acquires, PAIRS_IN_PROCESS // 4)
    rows = [
        ("Python Limiter (in process), reserve+complete", python, ""),
        ("Rust MemoryBackend, reserve+complete", rust["memory"], f"binding keeps {python / rust['memory']:.0%}"),
        ("aiolimiter AsyncLimiter, acquire (counting only)", aio, f"Limiter pair is {python / aio:.2f}x"),
        ("pyrate-limiter try_acquire (counting only)", pyrate, f"Limiter pair is {python / pyrate:.2f}x"),
    ]
    if args.remote:
        remote = RemoteLimiter(args.remote)
        remote.define_many(definitions("pyremote"))
        remote_rate = best_rate(limiter_pairs(remote, "pyremote"), PAIRS_REMOTE)
        rows += [
            ("Python RemoteLimiter, reserve+complete (sync)", remote_rate, ""),
            ("Rust HttpClient, reserve+complete", rust["http"], f"binding keeps {remote_rate / rust['http']:.0%}"),
        ]
    print("| Measurement | pairs/s | Ratio |\n| --- | ---: | --- |")
    for name, rate, ratio in rows:
        print(f"| {name} | {rate:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
