"""The service under load while it and its PostgreSQL fail: producers and consumers through the client's
retries, the service SIGKILLed and restarted, PostgreSQL crashed and restarted, its connections terminated.
No event lost or registered twice, every flow fired once over each event. The harness is benchmarks/soak.py
(``make bench-soak`` runs it longer for docs/benchmarks.md); each run starts its own PostgreSQL, so the
restarts touch no other test's server."""

from __future__ import annotations

import pytest

from benchmarks.soak import SERVICE_FAULTS, soak_service

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_no_event_is_lost_or_duplicated_and_every_flow_fires_once_through_kills_and_restarts():
    result = soak_service(producers=3, consumers=2, tables=3, seconds=24, fault_every=4, max_commits=20_000)
    assert result["problems"] == []
    assert [f["kind"] for f in result["faults"]][:4] == list(SERVICE_FAULTS)
    assert result["events"] > 1000 and result["firings"] >= 2 * 3
    assert result["attempts"] > result["commits"]  # the faults were felt: requests were retried
    assert result["recovery_s"]["max"] < 30
