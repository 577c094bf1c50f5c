"""The input files of a batch (``ingest``, ``replace``): Parquet, CSV with a header line, or JSON lines, read with
pyarrow as one stream of record batches in bounded memory. No Spark: a CSV or JSON file reads as Spark's reader
with the table's schema would, but on this machine."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pyarrow as pa

from bitlake.errors import InvalidInputError

INPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv",
                 ".json": "json", ".jsonl": "json", ".ndjson": "json"}


def input_format(paths: list[str], given: str | None) -> str:
    """Checks the inputs exist (before anything is read) and returns their format."""
    for p in paths:
        if not os.path.exists(p):
            raise InvalidInputError(f"no such input file: {p}")
    fmt = given or INPUT_FORMATS.get(os.path.splitext(paths[0].rstrip("/"))[1].lower())
    if fmt is None:
        raise InvalidInputError(
            f"cannot tell the format of {paths[0]}: pass --input-format parquet, csv or json")
    return fmt


def read_input(schema: pa.Schema, paths: list[str], fmt: str) -> pa.RecordBatchReader:
    """The input files (or folders: their files, those starting with "_" or "." skipped as Spark's markers are) as
    one stream of record batches.

    Parquet keeps its types (bitlake checks them against the table). CSV and JSON-lines files are read with the
    table's types for the columns the table has, matched by name regardless of case (an input column of another name
    keeps the type pyarrow infers, for bitlake to reject, or to serve as the op column). As Spark reads them: an
    empty CSV field is a null, and a time without a zone offset in a timestamp column is UTC. Every file must have
    the first one's columns.
    """
    import pyarrow.dataset as ds

    if fmt == "parquet":
        return ds.dataset([ds.dataset(p, format="parquet") for p in paths]).scanner().to_reader()
    types = {f.name.lower(): f for f in schema}
    files = [f for p in paths for f in _files(p)]
    if not files:
        raise InvalidInputError(f"no input files in {', '.join(paths)}")
    open_file = _open_csv if fmt == "csv" else _open_json
    first = open_file(files[0], types)
    return pa.RecordBatchReader.from_batches(first.schema, _chain(first, files[1:], open_file, types))


def _files(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [path]
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found += [os.path.join(root, n) for n in sorted(names) if not n.startswith(("_", "."))]
    return found


def _chain(first: pa.RecordBatchReader, rest: list[str], open_file: Callable, types: dict[str, pa.Field]
           ) -> Iterator[pa.RecordBatch]:
    yield from first
    for path in rest:
        reader = open_file(path, types)
        names = {n.lower(): n for n in reader.schema.names}
        if sorted(names) != sorted(n.lower() for n in first.schema.names):
            raise InvalidInputError(f"input {path} has the columns {reader.schema.names}; the first input has "
                                    f"{first.schema.names}")
        for batch in reader:
            # Columns in the first file's order; a type pyarrow inferred otherwise (an all-null op column) cast to it.
            yield pa.RecordBatch.from_arrays([batch.column(names[f.name.lower()]).cast(f.type) for f in first.schema],
                                             schema=first.schema)


def _open_csv(path: str, types: dict[str, pa.Field]) -> pa.RecordBatchReader:
    import pyarrow.csv as csv

    names = csv.open_csv(path).schema.names  # the header (pyarrow reads the first block)
    typed = {n: types[n.lower()].type for n in names if n.lower() in types}
    # pyarrow's CSV reader wants a zone offset in every value of a column with a time zone: such columns are read
    # as text, and a value without an offset is read as UTC.
    zoned = [n for n, t in typed.items() if pa.types.is_timestamp(t) and t.tz is not None]
    options = csv.ConvertOptions(column_types={**typed, **{n: pa.string() for n in zoned}}, strings_can_be_null=True)
    reader = csv.open_csv(path, convert_options=options)
    if not zoned:
        return reader
    out = pa.schema([pa.field(f.name, typed[f.name]) if f.name in zoned else f for f in reader.schema])
    return pa.RecordBatchReader.from_batches(out, (pa.RecordBatch.from_arrays(
        [_timestamps(c, typed[n], path, n) if n in zoned else c for n, c in zip(batch.schema.names, batch.columns,
                                                                                 strict=True)], schema=out)
        for batch in reader))


def _timestamps(text: pa.Array, type_: pa.TimestampType, path: str, column: str) -> pa.Array:
    try:
        return text.cast(type_)
    except pa.ArrowInvalid:
        pass
    try:
        return text.cast(pa.timestamp(type_.unit)).cast(type_)  # no offset: UTC
    except pa.ArrowInvalid as e:
        raise InvalidInputError(f"{path}: column {column!r}: {str(e).splitlines()[0]} (give every time of a column "
                                "with a zone offset, or none)") from None


def _open_json(path: str, types: dict[str, pa.Field]) -> pa.RecordBatchReader:
    import pyarrow.json as pajson

    names = pajson.open_json(path).schema.names  # the fields of the first block's records
    found = {n.lower() for n in names}
    # A table column the first block lacks is still read with its type: a later record may hold it.
    typed = pa.schema([(n, types[n.lower()].type) for n in names if n.lower() in types]
                      + [(f.name, f.type) for key, f in types.items() if key not in found])
    return pajson.open_json(path, parse_options=pajson.ParseOptions(explicit_schema=typed,
                                                                    unexpected_field_behavior="infer"))
