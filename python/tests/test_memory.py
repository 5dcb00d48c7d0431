"""The in-process limiter: every semantic of the Rust library, through Python."""

from __future__ import annotations

import contextlib
import gc
import glob
import json
import os
import threading
import time

import pytest

from llm_ratelimiter import (
    ArgumentTypeError,
    InvalidArgumentError,
    LimitConflictError,
    LimitDefinition,
    Limiter,
    UnknownLimitKeyError,
    llm_limits,
    new_lease_id,
)

RPM = "global:llm:openai:gpt-4o:rpm"
TPM = "global:llm:openai:gpt-4o:tpm"
CONC = "global:llm:openai:gpt-4o:concurrency"
START_MS = 1_700_000_000_000


def limiter(**kwargs: int) -> Limiter:
    return Limiter(llm_limits("openai", "gpt-4o", rpm=100, tpm=1_000, concurrency=2, profile=False), manual_clock_unix_ms=START_MS,
                   **kwargs)


def four(tokens: int) -> list:
    return [(RPM, 1), (TPM, tokens), (CONC, 1), ("tenant:acme:llm:daily_tokens", tokens)]


def test_all_or_nothing_and_the_denying_key() -> None:
    lim = limiter()
    lim.define(LimitDefinition.rolling("tenant:acme:llm:daily_tokens", 500, 86_400))
    first = lim.reserve(four(400))
    assert first.allowed and first.reserved_at_unix_ms == START_MS and first.denial is None
    second = lim.reserve(four(400))
    assert not second and second.denial.reason == "insufficient_capacity"
    assert second.denial.key == "tenant:acme:llm:daily_tokens" and not second.denial.is_final
    # Nothing of the denied reserve is held.
    assert lim.limit(RPM).in_use == 1 and lim.limit(TPM).in_use == 400 and lim.limit(CONC).in_use == 1


def test_retry_hint_is_the_time_until_capacity_frees() -> None:
    lim = limiter()
    assert lim.reserve([(TPM, 1_000)])
    lim.advance_clock_ms(20_000)
    denied = lim.reserve([(TPM, 1)])
    # The 60 s window and its default margin (0.4 % of a minute, 240 ms) free the tokens
    # 40.24 s from now; the hint adds at most the rolling jitter.
    assert 40_240 <= denied.denial.retry_after_ms <= 40_240 + 50
    lim.advance_clock_ms(40_239)
    assert not lim.reserve([(TPM, 1)])
    lim.advance_clock_ms(1)
    assert lim.reserve([(TPM, 1)]).allowed


def test_final_denials() -> None:
    lim = limiter()
    too_big = lim.reserve([(TPM, 1_001)])
    assert too_big.denial.reason == "exceeds_capacity" and too_big.denial.is_final
    assert too_big.denial.retry_after_ms == 0 and too_big.denial.error_code == f"exceeds_capacity:{TPM}"
    assert lim.reserve([(TPM, 1_000)])
    not_now = lim.reserve([(TPM, 1)])
    assert not_now.denial.reason == "insufficient_capacity"
    lim.advance_clock_ms(61_000)
    again = lim.reserve([(TPM, 1)], lease_id=not_now.lease_id)
    assert again.denial.reason == "lease_already_failed" and again.denial.is_final and again.denial.key is None


def test_lease_ids_are_idempotent() -> None:
    lim = limiter()
    lease = new_lease_id()
    first = lim.reserve([(TPM, 300)], lease_id=lease)
    lim.advance_clock_ms(5)
    retry = lim.reserve([(TPM, 300)], lease_id=lease)
    assert retry.allowed and retry.reserved_at_unix_ms == first.reserved_at_unix_ms
    assert lim.limit(TPM).in_use == 300
    with pytest.raises(LimitConflictError):
        lim.reserve([(TPM, 301)], lease_id=lease)


def test_complete_releases_and_reconciles_and_is_idempotent() -> None:
    lim = limiter()
    r = lim.reserve([(TPM, 800), (CONC, 2)])
    lim.complete(r.lease_id, [(TPM, 120)])
    lim.complete(r.lease_id, [(TPM, 999)])
    assert lim.limit(TPM).in_use == 120 and lim.limit(CONC).in_use == 0
    lim.complete(new_lease_id())  # unknown lease: nothing happens


def test_overage_is_dropped_or_recorded_as_debt() -> None:
    lim = limiter()
    lim.define(LimitDefinition.rolling("budget:x", 100, 60, overage="debt"))
    r = lim.reserve([("budget:x", 90)])
    lim.complete(r.lease_id, [("budget:x", 130)])
    report = lim.limit("budget:x")
    assert report.in_use == 90 and report.debt == 40
    r = lim.reserve([(TPM, 100)])
    lim.complete(r.lease_id, [(TPM, 5_000)])  # overage "none": dropped
    assert lim.limit(TPM).in_use == 100 and lim.limit(TPM).debt == 0


def test_a_budget_that_owes_refuses_until_its_window_ends() -> None:
    lim = limiter()
    lim.define(LimitDefinition.rolling("budget:owe", 100, 60, overage="owe"))
    first = lim.reserve([("budget:owe", 60)])
    second = lim.reserve([("budget:owe", 30)])
    lim.complete(first.lease_id, [("budget:owe", 90)])  # 30 more do not fit in the 10 left
    report = lim.limit("budget:owe")
    assert report.owing and report.debt == 30
    lim.complete(second.lease_id, [("budget:owe", 0)])  # 30 freed
    denied = lim.reserve([("budget:owe", 1)])
    assert denied.denial.reason == "insufficient_capacity" and denied.denial.retry_after_ms > 0


def test_decrease_waits_for_usage() -> None:
    lim = limiter()
    r = lim.reserve([(CONC, 2)])
    report = lim.define(LimitDefinition.concurrency(CONC, 1, 300))
    assert report.status == "decreasing" and report.pending_decrease_to == 1
    denied = lim.reserve([(CONC, 1)])
    assert denied.denial.reason == "limit_decreasing" and denied.denial.retry_after_ms == 10_000
    lim.complete(r.lease_id)
    assert lim.apply_pending_decreases() == 1
    assert lim.limit(CONC).definition.capacity == 1 and lim.limit(CONC).status == "active"


def test_bad_input_names_the_field() -> None:
    lim = limiter()
    cases = [
        (lambda: lim.reserve([(TPM, -1)]), InvalidArgumentError, "requirements[0].amount"),
        (lambda: lim.reserve([(TPM, "3")]), ArgumentTypeError, "requirements[0].amount"),
        (lambda: lim.reserve([("bad key", 1)]), InvalidArgumentError, "requirements[0].key"),
        (lambda: lim.reserve([(TPM, 0)]), InvalidArgumentError, "requirements"),
        (lambda: lim.reserve([]), InvalidArgumentError, "requirements"),
        (lambda: lim.reserve(5), ArgumentTypeError, "requirements"),
        (lambda: lim.reserve([(TPM, 1)], lease_id="nope"), InvalidArgumentError, "lease_id"),
        (lambda: lim.complete(None), ArgumentTypeError, "lease_id"),
        (lambda: lim.define({"key": "k", "kind": "rolling", "capacity": 0, "window_seconds": 1}),
         InvalidArgumentError, "definition"),
        (lambda: Limiter(leases_max=0), InvalidArgumentError, "leases_max"),
    ]
    for call, error, field in cases:
        with pytest.raises(error) as info:
            call()
        assert info.value.field == field, (field, info.value)
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(ArgumentTypeError, TypeError)
    with pytest.raises(UnknownLimitKeyError) as unknown:
        lim.reserve([("global:llm:x:y:rpm", 1)])
    assert unknown.value.key == "global:llm:x:y:rpm"


def test_limits_file_as_ratelimiterd_writes_it(tmp_path) -> None:
    path = tmp_path / "limits.json"
    entries = [dict(json.loads(d.to_json()), status="active", pending_decrease_to=0)
               for d in llm_limits("openai", "gpt-4o", rpm=5, tpm=50, concurrency=1, profile=False)]
    path.write_text(json.dumps(entries))
    lim = Limiter(limits_file=path)
    assert [r.definition.key for r in lim.limits()] == sorted([CONC, RPM, TPM])
    assert lim.limit(TPM).definition.capacity == 50
    path.write_text("[{")
    with pytest.raises(InvalidArgumentError):
        Limiter(limits_file=path)
    with pytest.raises(FileNotFoundError):
        Limiter(limits_file=tmp_path / "missing.json")


def test_threads_never_exceed_a_limit() -> None:
    lim = Limiter([LimitDefinition.concurrency("slots", 3, 60)])
    held, peak, lock = [0], [0], threading.Lock()

    def worker() -> None:
        for _ in range(2_000):
            r = lim.reserve([("slots", 1)])
            if r:
                with lock:
                    held[0] += 1
                    peak[0] = max(peak[0], held[0])
                with lock:
                    held[0] -= 1
                lim.complete(r.lease_id)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 3 and lim.limit("slots").in_use == 0


def _decrease_threads() -> int:
    """The limiters' decrease threads alive in this process (Linux: /proc)."""
    names = []
    for comm in glob.glob("/proc/self/task/*/comm"):
        with contextlib.suppress(OSError), open(comm) as f:
            names.append(f.read().strip())
    return names.count("llmrl-decrease")


def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


def test_a_decrease_is_carried_out_by_itself_on_the_system_clock() -> None:
    # Issue 21: as ratelimiterd's decrease task, no manual call needed.
    lim = Limiter([LimitDefinition.concurrency(CONC, 2, 300)], decrease_check_interval_ms=20)
    held = lim.reserve([(CONC, 2)])
    assert lim.define(LimitDefinition.concurrency(CONC, 1, 300)).status == "decreasing"
    lim.complete(held.lease_id)
    _wait_for(lambda: lim.limit(CONC).status == "active", "the decrease carried out")
    assert lim.limit(CONC).definition.capacity == 1
    assert lim.apply_pending_decreases() == 0


def test_on_a_manual_clock_advancing_carries_decreases_out() -> None:
    lim = limiter()
    r = lim.reserve([(TPM, 800)])
    lim.complete(r.lease_id, [(TPM, 800)])
    assert lim.define(LimitDefinition.rolling(TPM, 500, 60)).status == "decreasing"
    lim.advance_clock_ms(1_000)
    assert lim.limit(TPM).status == "decreasing", "800 held still do not fit 500"
    lim.advance_clock_ms(61_000)
    report = lim.limit(TPM)
    assert report.status == "active" and report.definition.capacity == 500


def test_without_the_thread_a_decrease_waits_for_the_call() -> None:
    lim = Limiter([LimitDefinition.concurrency(CONC, 2, 300)], decrease_check_interval_ms=0)
    held = lim.reserve([(CONC, 2)])
    lim.define(LimitDefinition.concurrency(CONC, 1, 300))
    lim.complete(held.lease_id)
    time.sleep(0.05)
    assert lim.limit(CONC).status == "decreasing"
    assert lim.apply_pending_decreases() == 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_a_dropped_limiter_stops_its_decrease_thread() -> None:
    gc.collect()
    time.sleep(0.1)  # Threads of limiters collected just now exit meanwhile.
    before = _decrease_threads()
    limiters = [Limiter(decrease_check_interval_ms=3_600_000) for _ in range(8)]
    # A thread names itself once it runs.
    _wait_for(lambda: _decrease_threads() >= before + 8, "a thread per limiter")
    del limiters
    gc.collect()
    _wait_for(lambda: _decrease_threads() <= before, "the threads stopped")


def test_a_bad_decrease_check_interval_raises_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Limiter(decrease_check_interval_ms=3_600_001)
    assert e.value.field == "decrease_check_interval_ms"
    for bad in (-1, "1000", 1.5):
        with pytest.raises((InvalidArgumentError, ArgumentTypeError)) as e:
            Limiter(decrease_check_interval_ms=bad)  # type: ignore[arg-type]
        assert e.value.field == "decrease_check_interval_ms"
