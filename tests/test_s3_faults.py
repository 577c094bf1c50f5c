"""A faulty S3 (tests/faultproxy.py in front of moto's server): every table operation either succeeds or raises a
clear StorageError with nothing half-visible, a retried operation commits once, and reads never return wrong
rows. The same workload runs on local disk without faults, and the two tables must agree after every step
(docs/storage.md, "Faults")."""

from __future__ import annotations

import contextlib
import time

import pyarrow as pa
import pytest

import bitlake
from bitlake.fs import file_io, objectstore
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.s3

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("name", pa.string()), ("region", pa.string())])
USER = ["id", "ts", "name", "region"]
COMMIT = r"/_bitlake/commits/\d+\.json$"
# Quick retries, so that the test's faults cost little time; a request hanging past 2 s is a timeout.
FAST = {"timeout": "2s", "connect_timeout": "1s", "max_retries": "10", "retry_timeout": "20s",
        "backoff_config.init_backoff": "5ms", "backoff_config.max_backoff": "100ms", "backoff_config.base": "2"}


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.endpoint, seed=0, delay=0.2) as p:
        yield p


def options(s3_server, proxy, **extra) -> dict:
    return {**s3_server.options, "AWS_ENDPOINT_URL": proxy.endpoint, **FAST, **extra}


def rows(n0: int, n1: int, ts: int, name: str = "n") -> pa.Table:
    ids = list(range(n0, n1))
    return pa.table({"id": ids, "ts": [ts] * len(ids), "name": [f"{name}{i}" for i in ids],
                     "region": ["X" if i % 7 == 0 else "EU" for i in ids]}, schema=SCHEMA)


def with_ops(t: pa.Table, ops: list[str]) -> pa.Table:
    return t.append_column("op", pa.array(ops))


def view(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r[c] for c in USER) for r in t.select(USER).to_pylist())


def changes(t: pa.Table) -> list[tuple]:
    cols = [*USER, "_change_type", "_commit_version"]
    return [tuple(r[c] for c in cols) for r in t.select(cols).to_pylist()]


# The workload: each step is (name, function of a table). Batch ids make a re-run ingest a no-op.
STEPS = [
    ("ingest b1", lambda t: t.ingest(rows(0, 120, 1), batch_id="b1", inline=True)),
    ("ingest b2 upserts and deletes", lambda t: t.ingest(
        with_ops(rows(100, 160, 2, "u"), ["delete" if i % 5 == 0 else "upsert" for i in range(100, 160)]),
        op_column="op", batch_id="b2", inline=True)),
    ("ingest b3", lambda t: t.ingest(rows(150, 200, 3, "w"), batch_id="b3", inline=True)),
    ("revert b2", lambda t: t.revert_batch("b2")),
    ("replace b3", lambda t: t.replace_batch("b3", rows(180, 230, 4, "r"))),
    ("tombstone", lambda t: t.tombstone("region", ["X"])),
    ("vacuum", lambda t: t.vacuum()),
    ("delete", lambda t: t.delete("id < 20")),
    ("update", lambda t: t.update("id >= 30 and id < 40", set={"name": "'upd'", "ts": "ts + 10"})),
    ("merge", lambda t: t.merge(rows(35, 45, 20, "m"), on=["id"]).when_matched_update_all()
        .when_not_matched_insert_all().execute()),
    ("compact", lambda t: t.compact(target_file_bytes=1 << 20)),
    ("cleanup", lambda t: t.cleanup(min_age_seconds=0)),
    ("ingest b4", lambda t: t.ingest(rows(300, 340, 5), batch_id="b4", inline=True)),
]


def create(uri: str, storage_options: dict | None = None) -> bitlake.Table:
    return bitlake.create_table(uri, SCHEMA, primary_key=["id"], delta_column="ts", num_buckets=2,
                                storage_options=storage_options)


@contextlib.contextmanager
def paused(proxy: FaultProxy):
    """No faults inside: what a user learns by trying again once the store recovered."""
    with_rate, proxy.rate = proxy.rate, 0.0
    try:
        yield
    finally:
        proxy.rate = with_rate


def read_or_storage_error(proxy: FaultProxy, what, opts: dict, sure: dict, attempts: int = 5):
    """``what(options)``, a read under faults with ``opts``: the right rows or a StorageError, never wrong rows;
    after ``attempts`` StorageErrors it is read once more with the faults paused and the ``sure`` options."""
    for _ in range(attempts):
        try:
            return what(opts)
        except bitlake.StorageError:
            continue
    with paused(proxy):
        return what(sure)


def again(step, table, version, before: int, attempts: int = 3) -> None:
    """``step`` run again on ``table`` with the faults paused, as a user would after a failure; a StorageError
    (with one retry, a pooled connection an earlier fault broke can fail both tries: seen once in CI, a PUT
    timing out twice) is tried again while the table holds no commit of it (``version()`` still ``before``); one
    that landed despite the error is left as it is (the caller checks it holds the commit once)."""
    for attempt in range(attempts):
        try:
            step(table)
            return
        except bitlake.StorageError:
            if version() != before:
                return
            if attempt == attempts - 1:
                raise


def run_workload(tmp_path, s3_server, proxy, seed: int, rate: float, **extra) -> dict:
    local = create(str(tmp_path / f"local-{seed}"))
    proxy.rate = rate
    proxy._random.seed(seed)
    opts = options(s3_server, proxy, **extra)
    # What the test looks at between steps, with the faults paused, it reads with the default retries: with one
    # retry, a pooled connection an earlier fault broke can fail both tries (seen in CI: a GET of commit 0).
    sure = options(s3_server, proxy)
    uri = s3_server.uri(f"faults-{seed}")
    try:
        remote = create(uri, opts)
    except bitlake.StorageError:  # create_table is no exception: its commit 0 may have landed
        with paused(proxy):
            remote = bitlake.open_table(uri, opts) if _exists(uri, sure) else create(uri, opts)
    failed = []
    for name, step in STEPS:
        step(local)
        with paused(proxy):
            before = bitlake.open_table(uri, sure).version
        try:
            step(remote)
        except bitlake.StorageError as e:
            failed.append((name, str(e)))
            assert "\n" not in str(e) and uri in str(e), f"{name}: an unclear error: {e}"
            with paused(proxy):
                after = bitlake.open_table(uri, sure).version
                assert after in (before, before + 1), f"{name}: {after - before} commits after a failure"
                if after == before:  # it did not land: run it again, as a user would
                    again(step, remote, lambda: bitlake.open_table(uri, sure).version, before)
        with paused(proxy):
            after = bitlake.open_table(uri, sure).version
        assert after == local.version, f"{name}: a commit lost or duplicated ({after} != {local.version})"
        got = read_or_storage_error(proxy, lambda o: view(bitlake.open_table(uri, o).to_arrow()), opts, sure)
        assert got == view(local.to_arrow()), f"wrong rows after {name}"
    for v in range(1, local.version + 1):
        got = read_or_storage_error(
            proxy, lambda o, v=v: view(bitlake.open_table(uri, o).to_arrow(version=v)), opts, sure)
        assert got == view(local.to_arrow(version=v)), f"wrong rows at version {v}"
    got = read_or_storage_error(
        proxy, lambda o: changes(bitlake.open_table(uri, o).changes_to_arrow(starting_version=1)), opts, sure)
    assert got == changes(local.changes_to_arrow(starting_version=1))
    proxy.quiet()
    return {"faults": proxy.count(), "requests": proxy.requests, "failed": failed}


def _exists(uri: str, opts: dict) -> bool:
    return bool(file_io(uri, opts).listdir("_bitlake/commits"))


def test_every_operation_survives_a_five_percent_fault_rate(tmp_path, s3_server, proxy):
    """Each fault kind at 5% of every request: the defaults' retries carry every operation through."""
    result = run_workload(tmp_path, s3_server, proxy, seed=1, rate=0.05)
    assert result["faults"] > 20, result
    assert result["failed"] == [], result


@pytest.mark.slow
def test_operations_that_give_up_leave_their_commit_once_or_not_at_all(tmp_path, s3_server, proxy):
    """At 20% with one retry, operations give up: each with a StorageError naming the table, after which the
    table holds its commit once or not at all, and running it again gives the faultless result."""
    result = run_workload(tmp_path, s3_server, proxy, seed=43, rate=0.20, max_retries="1")
    assert result["faults"] > 100, result
    assert len(result["failed"]) >= 3, result


def test_a_lost_answer_to_the_commit_put_is_a_success_with_one_commit(s3_server, proxy):
    t = create(s3_server.uri("lost"), options(s3_server, proxy))
    for fault in ("lost_answer", "landed_500"):
        before = t.version
        proxy.schedule(fault, method="PUT", path=COMMIT)
        result = t.ingest(rows(before * 10, before * 10 + 10, before), batch_id=f"b-{fault}")
        assert proxy.pending() == 0 and proxy.count(fault) == 1, proxy.injected
        assert result.version == before + 1 and t.version == before + 1
        assert [h["version"] for h in t.history()][:2] == [before + 1, before]
    assert len(t.to_arrow()) == 20


def test_a_commit_put_that_lands_after_the_client_gave_up(s3_server, proxy):
    """A PUT held past the client's timeout reaches the store later: the retry finds the commit there (or puts
    it first, and the late one is refused); either way one commit."""
    t = create(s3_server.uri("late"), options(s3_server, proxy, timeout="1s"))
    proxy.delay = 1.5
    proxy.schedule("delay", method="PUT", path=COMMIT)
    assert t.ingest(rows(0, 10, 1), batch_id="late").version == 1
    time.sleep(0.8)  # the held request lands, or is refused, now
    assert bitlake.open_table(t.io).version == 1 and len(t.to_arrow()) == 10


def test_a_claim_put_retried_after_its_answer_was_lost_is_the_writers_own(s3_server, proxy):
    t = create(s3_server.uri("claim"), options(s3_server, proxy))
    proxy.schedule("lost_answer", method="PUT", path=r"/_bitlake/parts/\d+$")
    t.ingest(rows(0, 10, 1), batch_id="b")
    assert proxy.count("lost_answer") == 1
    assert t.refresh().max_part == 1, "the writer kept the part it claimed, not the next one"


def test_put_if_absent_resolves_a_retry_that_finds_its_own_object(s3_server, proxy):
    io = file_io(s3_server.uri("pia"), options(s3_server, proxy))
    proxy.schedule("landed_500", method="PUT", path="/mine$")
    io.put_if_absent("mine", b"my bytes")
    assert io.read_bytes("mine") == b"my bytes"
    with pytest.raises(FileExistsError):
        io.put_if_absent("mine", b"my bytes")  # no failed try before: the object is someone's, not this call's
    io.write_atomic("theirs", b"their bytes")
    proxy.schedule("lost_answer", method="PUT", path="/theirs$")
    with pytest.raises(FileExistsError):  # the try whose answer was lost did not land: the object is not ours
        io.put_if_absent("theirs", b"my bytes")


@pytest.mark.parametrize("fault", ["reset_during", "truncate"])
def test_a_data_file_get_cut_short_is_read_again(s3_server, proxy, fault, monkeypatch):
    t = create(s3_server.uri(fault), options(s3_server, proxy))
    t.ingest(rows(0, 300, 1), batch_id="b")
    expected = view(t.to_arrow())
    data = r"/data/.*\.parquet$"
    proxy.schedule(fault, method="GET", path=data, count=2)
    assert view(bitlake.open_table(t.io).to_arrow()) == expected
    assert proxy.count(fault) == 2
    # A large file is read by ranges (a Parquet reader asks for its footer, then columns): each range too.
    monkeypatch.setattr(objectstore, "WHOLE_READ_BYTES", 64)
    proxy.schedule(fault, method="GET", path=data, count=3)
    assert view(bitlake.open_table(t.io).to_arrow()) == expected
    assert proxy.count(fault) == 5


def test_a_burst_of_slow_downs_is_retried(s3_server, proxy):
    t = create(s3_server.uri("burst"), options(s3_server, proxy))
    proxy.schedule("slow_down", count=6)
    proxy.schedule("internal_error", method="PUT", count=3)
    t.ingest(rows(0, 50, 1), batch_id="b")
    assert proxy.pending() == 0
    assert len(bitlake.open_table(t.io).to_arrow()) == 50


def test_a_store_that_keeps_failing_is_a_storage_error_with_nothing_visible(s3_server, proxy):
    opts = options(s3_server, proxy, retry_timeout="1s", max_retries="3")
    t = create(s3_server.uri("down"), opts)
    t.ingest(rows(0, 10, 1), batch_id="b1")
    for fault in ("slow_down", "reset_before", "internal_error"):
        proxy.rate, proxy.faults = 1.0, (fault,)
        started = time.monotonic()
        with pytest.raises(bitlake.StorageError) as e:
            t.ingest(rows(10, 20, 2), batch_id="b2")
        assert time.monotonic() - started < 15
        message = str(e.value)
        assert "\n" not in message and message.startswith(t.io.uri()), message
        proxy.quiet()
        assert bitlake.open_table(t.io).version == 1 and len(t.to_arrow()) == 10, "nothing of b2 is visible"
    assert t.ingest(rows(10, 20, 2), batch_id="b2").version == 2
    t.cleanup(min_age_seconds=0)
    assert view(t.to_arrow()) == view(pa.concat_tables([rows(0, 10, 1), rows(10, 20, 2)]))


def test_retry_options_are_storage_options(s3_server):
    io = file_io(s3_server.uri("opts"), {**s3_server.options, "max_retries": 3, "retry_timeout": "1min 30s",
                                         "BACKOFF_CONFIG.INIT_BACKOFF": "50ms", "backoff_config.base": "3"})
    assert (io._retry.max_retries, io._retry.retry_timeout, io._retry.init_backoff, io._retry.base) == (3, 90, 0.05, 3)
    assert io._retry.max_backoff == 15.0, "the default"
    with pytest.raises(bitlake.InvalidInputError, match="retry_timeout"):
        file_io(s3_server.uri("opts"), {**s3_server.options, "retry_timeout": "soon"})
    other = file_io(s3_server.uri("opts"), {**s3_server.options, "retry_config": {"max_retries": 1}})
    assert other._retry.max_retries == 1
    import pickle
    assert pickle.loads(pickle.dumps(io))._retry == io._retry


def test_what_is_tried_again():
    """The store's and the network's failures are; the request's own are not, even when the client's debug dump
    under the message names a timeout setting."""
    from obstore.exceptions import GenericError

    from bitlake.fs import retries

    def error(first: str) -> GenericError:
        return GenericError(f"Generic S3 error: {first}\n\nDebug source:\n    retry_timeout: 180s, kind: Timeout")

    assert retries.transient(error("Error performing PUT u in 1ms - HTTP error: error sending request"))
    assert retries.transient(error("Error performing GET u in 9ms - Server returned non-2xx status code: 503 Slow"))
    assert retries.broken_body(error("Error getting list response body: HTTP error: request or response body error"))
    assert not retries.broken_body(error("Error performing PUT u in 1ms - HTTP error: error sending request"))
    assert not retries.transient(error("Error performing GET u in 2ms - Server returned non-2xx status code: 400"))
    assert retries.transient(retries.ShortRead("read 5 of 10 bytes"))


def test_reads_under_faults_return_right_rows_or_a_storage_error(s3_server, proxy):
    """Reads (the view, time travel, the change feed) at a 10% rate of read faults: the right rows, or a
    StorageError after the retries, never wrong rows."""
    t = create(s3_server.uri("reads"), options(s3_server, proxy))
    t.ingest(rows(0, 100, 1), batch_id="b1")
    t.ingest(rows(50, 150, 2, "u"), batch_id="b2")
    expected = {1: view(t.to_arrow(version=1)), 2: view(t.to_arrow())}
    feed = changes(t.changes_to_arrow(starting_version=1))
    proxy.rate, proxy.faults = 0.10, ("slow_down", "reset_before", "reset_during", "truncate", "internal_error")
    errors = 0
    for i in range(12):
        v = 1 + i % 2
        try:
            reopened = bitlake.open_table(t.io)
            assert view(reopened.to_arrow(version=v)) == expected[v]
            assert changes(reopened.changes_to_arrow(starting_version=1)) == feed
        except bitlake.StorageError:
            errors += 1
    assert proxy.count() > 10 and errors <= 1, (proxy.count(), errors)


def test_a_large_file_is_a_multipart_upload_that_fails_whole(s3_server, proxy, monkeypatch):
    """A file larger than one put's buffer is a multipart upload: its requests' 5xx are retried; an upload whose
    answer breaks off fails the write with a StorageError, and no object appears under the name."""
    monkeypatch.setattr(objectstore, "_WRITE_BUFFER", 5 << 20)  # S3's smallest part
    io = file_io(s3_server.uri("multipart"), options(s3_server, proxy))
    data = bytes(range(256)) * (24 << 10)  # 6 MiB: two parts
    proxy.schedule("slow_down", method="PUT", count=2)
    proxy.schedule("internal_error", method="POST", count=2)
    with io.open_output("big") as f:
        f.write(data)
    assert proxy.pending() == 0 and io.read_bytes("big") == data
    proxy.schedule("reset_during", method="POST", count=1)  # the answer to the upload's start
    with pytest.raises(bitlake.StorageError, match=r"/broken: .*multipart upload"):
        with io.open_output("broken") as f:
            f.write(data)
    assert not io.exists("broken")
    with io.open_output("small") as f:  # a small file is one put, retried like any other
        proxy.schedule("reset_before", method="PUT", count=2)
        f.write(b"small")
    assert io.read_bytes("small") == b"small"


@pytest.mark.spark
@pytest.mark.slow
def test_spark_metagen_and_reads_under_faults(tmp_path, s3_server, proxy, spark):
    """A Spark MetaGen of a batch that updates keys (its tasks read and write through the table's FileIO, pickled with its retry options) at
    a 5% fault rate, and Spark's read of the table, agree with the same batches on local disk (inline there)."""
    local = create(str(tmp_path / "local"))
    remote = create(s3_server.uri("spark"), options(s3_server, proxy))
    proxy.rate = 0.05
    for t, inline in ((local, True), (remote, False)):
        t.ingest(rows(0, 200, 1), batch_id="b0", inline=True)
        t.ingest(rows(150, 300, 2, "u"), batch_id="b1", inline=inline, spark=spark)  # updates 50 keys
    assert remote.version == local.version
    assert view(remote.to_arrow()) == view(local.to_arrow())
    got = remote.to_spark(spark).select(*USER).collect()
    assert sorted(tuple(r) for r in got) == view(local.to_arrow())
    assert proxy.count() > 0
