"""Calls as fast as ``Limiter(llm_limits(...))`` allows against each provider shape
(issue 19, "Proof"): ``provider-sim`` enforcing a 60 s sliding log, OpenAI's 1 s
quantization, Azure's 10 s request check and Anthropic's buckets, with the same
published numbers (600 requests a minute; tokens do not bind). For each shape, two
limiters: the plain ``llm_limits`` (one rolling minute per limit, as before) and
``llm_limits(..., profile=True)``. Reported per run: the provider's 429s and the
calls it admitted, against what its enforcement lets through in the run's time
(sliding: the minute's 600; quantized: a period's share per period; buckets: the
full bucket plus its refill), all measured in the same run.

Run from the repository root in a venv holding the package, with provider-sim built:
  python python/bench/bench_profiles.py [--provider-sim target/release/provider-sim] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, List, Tuple

from llm_ratelimiter import Limiter, llm_limits

RPM = 600
#: Tokens a minute: far above what the calls use, so requests bind.
TPM = 10_000_000
WORKERS = 32
PROMPT = "hello there"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allowed(shape: str, seconds: float) -> int:
    """What the shape's enforcement admits at most in ``seconds`` from a fresh start."""
    if shape == "openai":
        return int(RPM // 60 * (int(seconds) + 1))
    if shape == "azure":
        return int(RPM // 6 * (int(seconds // 10) + 1))
    if shape == "anthropic":
        return int(RPM + RPM / 60 * seconds)
    return RPM if seconds < 60 else int(RPM * (seconds // 60 + 1))


def run(sim: str, shape: str, profiled: bool, seconds: float) -> Dict[str, float]:
    port = free_port()
    provider = "openai" if shape == "sliding" else shape
    model = f"bench-{shape}-{int(profiled)}"
    # provider-sim answers 404 for a model it does not serve: name the one called.
    args = [sim, "--listen", f"127.0.0.1:{port}", "--rpm", str(RPM), "--tpm", str(TPM), "--concurrency", "1000",
            "--ms-per-output-token", "0", "--profile", shape, "--output-tpm", str(TPM), "--models", model]
    process = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        if not profiled:
            limits = llm_limits(provider, model, rpm=RPM, tpm=TPM, concurrency=WORKERS, profile=False)
        elif shape == "anthropic":
            limits = llm_limits(provider, model, rpm=RPM, input_tpm=TPM, output_tpm=TPM, profile=True)
        else:
            limits = llm_limits(provider, model, rpm=RPM, tpm=TPM, profile=True)
        limiter = Limiter(limits)
        counts = {"admitted": 0, "refused": 0}
        lock = threading.Lock()
        stop_at = time.monotonic() + seconds
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16,
                           "sim_output_tokens": 1}).encode()

        def worker() -> None:
            while time.monotonic() < stop_at:
                try:
                    with limiter.llm_call(provider, model, "t", PROMPT, 16, prompt_tokens=3,
                                          timeout_s=max(stop_at - time.monotonic(), 0.01)) as lease:
                        if time.monotonic() >= stop_at:
                            return
                        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                                         {"content-type": "application/json"})
                        try:
                            with urllib.request.urlopen(request) as answer:
                                lease.record_usage(json.loads(answer.read()))
                            key = "admitted"
                        except urllib.error.HTTPError as error:
                            key = "refused" if error.code == 429 else "failed"
                            lease.record_usage(0)
                        with lock:
                            counts[key] = counts.get(key, 0) + 1
                except Exception:  # noqa: BLE001 - the deadline ended the wait
                    return

        threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ceiling = allowed(shape, seconds)
        return {"admitted": counts["admitted"], "refused": counts["refused"], "failed": counts.get("failed", 0),
                "allowed": ceiling, "share": counts["admitted"] / ceiling}
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider-sim", default="target/release/provider-sim")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    rows: List[Tuple[str, str, Dict[str, float]]] = []
    for shape in ("sliding", "openai", "azure", "anthropic"):
        for profiled in (False, True):
            result = run(args.provider_sim, shape, profiled, args.seconds)
            rows.append((shape, "profile" if profiled else "plain", result))
            print(f"{shape:10} {rows[-1][1]:8} admitted {result['admitted']:5} refused {result['refused']:5} "
                  f"failed {result['failed']:5} of {result['allowed']:5} allowed: {100 * result['share']:.1f} %",
                  flush=True)


if __name__ == "__main__":
    main()
