"""Model-based test: random batch sequences through the real Spark and driver paths, compared to the oracle.

Each batch lands on the driver (Arrow input, or a small Spark DataFrame collected) or in a Spark job (from the
DataFrame's rows, or from the row groups of the Parquet file Spark would read), and
its MetaGen runs in Spark, or inline with the key index's point lookups, or inline with a scan of the key
store (folding in groups of buckets), at random, so one table mixes them all and each must continue from what the others committed. Minor
compactions run at random points between batches."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import bitlake
from bitlake.engine.keys import keyindex
from bitlake.engine.write import metagen
from tests.oracle import Oracle, Record, rows_key

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("BITLAKE_MODEL_EXAMPLES", "6"))
# Shrinking re-runs Spark jobs for minutes; CI reports the failing example as found, locally
# BITLAKE_MODEL_SHRINK=1 shrinks it.
PHASES = [p for p in Phase if os.environ.get("BITLAKE_MODEL_SHRINK") or p is not Phase.shrink]

record = st.tuples(
    st.integers(0, 6),  # key
    st.integers(0, 4),  # delta
    st.sampled_from(["upsert", "upsert", "upsert", "delete"]),
    st.integers(-1000, 1000),  # value
)
batch = st.tuples(
    st.lists(record, min_size=0, max_size=12),
    st.booleans(),  # run MetaGen at once
    st.booleans(),  # retry the batch id afterwards
    st.sampled_from(["spark", "inline-lookups", "inline-scan"]),  # how MetaGen runs
    st.sampled_from(["arrow", "collected", "spark-job", "spark-files"]),  # how the batch lands
    st.booleans(),  # compact afterwards
)


def _arrow(records, key_type, delta_type, to_delta):
    return pa.table(
        {
            "k": pa.array([key_type[1](r[0]) for r in records], key_type[0]),
            "grp": pa.array([f"g{r[0] % 2}" for r in records], pa.string()),
            "value": pa.array([None if r[2] == "delete" else r[3] for r in records], pa.int64()),
            "mod": pa.array([to_delta(r[1]) for r in records], delta_type),
            "op": pa.array([r[2] for r in records], pa.string()),
        }
    )


# Two kinds write every change to a bitmap as a delta (bitmap.deltas "always": these tables are too small for the
# cost rule to choose one).
KINDS = {
    "int-key/int-delta": ((pa.int64(), int), pa.int64(), lambda d: d * 10, {"properties": {"bitmap.deltas": "always"}}),
    "string-key/timestamp-delta/partitioned": (
        (pa.string(), lambda k: f"key-{k}"),
        pa.timestamp("us", tz="UTC"),
        lambda d: dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=d),
        {"partition_by": ["grp"]},
    ),
    "orc": ((pa.int32(), int), pa.int64(), lambda d: d, {"file_format": "orc", "properties": {"bitmap.deltas": "always"}}),
}


def _store(store: str, request):
    """The server of an object store that a table lives on (a ``uri(name)`` method), or None for a local folder."""
    if store == "s3":
        return request.getfixturevalue("s3_server")
    if store in ("azure", "gcs"):
        from tests import emulators

        return emulators.azurite() if store == "azure" else emulators.gcs()
    return None


# On the emulated Azure and GCS one kind each (tests/emulators.py): the store code is obstore's, as for S3.
@pytest.mark.parametrize("kind", [*KINDS, *(pytest.param(f"{k}@s3", marks=pytest.mark.s3) for k in list(KINDS)[:2]),
                                  pytest.param(f"{list(KINDS)[0]}@azure", marks=pytest.mark.azure),
                                  pytest.param(f"{list(KINDS)[1]}@gcs", marks=pytest.mark.gcs)])
def test_random_batches_match_the_oracle(spark, kind, monkeypatch, request):
    """``@s3``: the table on moto's S3 server, where Spark's jobs read the files through obstore; ``@azure`` and
    ``@gcs``: on Azurite and fake-gcs-server."""
    kind, _, store = kind.partition("@")
    key_type, delta_type, to_delta, options = KINDS[kind]
    options = dict(options)
    properties = {"keystore.max_increments": "2", "compact.min_log_files": "2", **options.pop("properties", {})}
    remote = _store(store, request)
    examples = max(1, EXAMPLES // 2) if store in ("azure", "gcs") else EXAMPLES  # a reduced variant
    schema = pa.schema([("k", key_type[0]), ("grp", pa.string()), ("value", pa.int64()), ("mod", delta_type)])

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.lists(batch, min_size=1, max_size=4))
    def run(batches):
        path = remote.uri("model") if remote else tempfile.mkdtemp(prefix="bitlake-model-")
        inputs = tempfile.mkdtemp(prefix="bitlake-model-input-")
        try:
            t = bitlake.create_table(
                path, schema, primary_key=["k"], delta_column="mod", num_buckets=3,
                properties=properties, **options,
            )
            oracle = Oracle()
            pending = []
            driver_max_bytes = None
            for i, (records, now, retry, mode, landing, compact) in enumerate(batches):
                data = _arrow(records, key_type, delta_type, to_delta)
                if landing != "arrow":
                    wanted = str(1 << 30) if landing == "collected" else "0"
                    if wanted != driver_max_bytes:
                        t.set_properties({"ingest.driver_max_bytes": wanted})
                        driver_max_bytes = wanted
                    if landing == "spark-files":  # a file Spark reads, whose row groups the landing tasks read
                        file = os.path.join(inputs, f"b{i}.parquet")
                        pq.write_table(data, file, row_group_size=2)
                        data = spark.read.parquet(file)
                    else:
                        data = spark.createDataFrame(data)
                # The inline MetaGen picks lookups or a scan by cost; these tables are tiny, so force it. The
                # scans also fold in groups of buckets, as commits of more than GROUP_RECORDS records do.
                monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0 if mode == "inline-lookups" else 10**12)
                monkeypatch.setattr(metagen, "GROUP_RECORDS", 2 if mode == "inline-scan" else 20_000_000)
                # The lookups' batches reach the key index as sorted SST files, as large commits do.
                monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1 if mode == "inline-lookups" else 200_000)
                result = t.ingest(data, op_column="op", batch_id=f"b{i}", metagen=now, inline=mode != "spark",
                                  spark=spark)
                assert result.committed
                expected_records = [
                    Record((key_type[1](r[0]),), to_delta(r[1]), r[2],
                           None if r[2] == "delete" else {"k": key_type[1](r[0]), "grp": f"g{r[0] % 2}",
                                                           "value": r[3], "mod": to_delta(r[1])})
                    for r in records
                ]
                pending.append((f"b{i}", expected_records))
                if now:
                    for batch_id, recs in pending:
                        counts = oracle.apply(recs)
                        if batch_id == f"b{i}":
                            assert result.counts == counts
                    pending = []
                    _check(t, oracle, spark=None)
                if retry:
                    again = t.ingest(data, op_column="op", batch_id=f"b{i}", metagen=True, spark=spark)
                    assert not again.committed
                    if now:
                        assert again.version == result.version
                if compact:
                    t.compact()
                    if now:
                        _check(t, oracle, spark=None)
            if pending:
                t.metagen(spark=spark)
                for _, recs in pending:
                    oracle.apply(recs)
            _check(t, oracle, spark=spark)
        finally:
            shutil.rmtree(inputs, ignore_errors=True)
            if not remote:
                shutil.rmtree(path, ignore_errors=True)

    run()


def _check(t, oracle, spark):
    columns = ["k", "grp", "value", "mod"]
    expected = rows_key(oracle.view(), columns)
    got = t.to_arrow().to_pylist()
    assert rows_key(got, columns) == expected
    if spark is not None:
        got_spark = [_utc(r.asDict()) for r in t.to_spark(spark).collect()]
        assert rows_key(got_spark, columns) == expected


def _utc(row: dict) -> dict:
    """PySpark returns timestamps as naive datetimes in UTC (the session time zone); Arrow as aware ones."""
    return {k: v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in row.items()}
