"""``--schema``: a table's columns in a compact spec (``id:int64,name:string,mod:timestamp``) or a JSON file
(what ``describe`` prints, or a Spark StructType), as an Arrow schema."""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa

from bitlake.errors import InvalidInputError
from bitlake.spark.schema import to_arrow_schema

TYPES = {
    "bool": pa.bool_(), "boolean": pa.bool_(),
    "int8": pa.int8(), "byte": pa.int8(),
    "int16": pa.int16(), "short": pa.int16(),
    "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(),
    "int64": pa.int64(), "long": pa.int64(), "bigint": pa.int64(),
    "float": pa.float32(), "float32": pa.float32(),
    "double": pa.float64(), "float64": pa.float64(),
    "string": pa.string(), "binary": pa.binary(),
    "date": pa.date32(), "date32": pa.date32(), "date32[day]": pa.date32(),
    # Spark's TIMESTAMP is an instant (Arrow: with a time zone); TIMESTAMP_NTZ is the local kind.
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "timestamp[us]": pa.timestamp("us"),
}
_LOWER_TYPES = {name.lower(): t for name, t in TYPES.items()}  # names are matched case-insensitively
_DECIMAL = re.compile(r"decimal(?:128)?\((\d+),\s*(\d+)\)")


def parse_type(text: str) -> pa.DataType:
    """A type name of the compact spec (``int64``, ``timestamp``, ``decimal(10,2)``…) as an Arrow type."""
    name = text.strip().lower()
    if name in _LOWER_TYPES:
        return _LOWER_TYPES[name]
    m = _DECIMAL.fullmatch(name)
    if m:
        return pa.decimal128(int(m[1]), int(m[2]))
    known = ", ".join(sorted(t for t in TYPES if "[" not in t))
    raise InvalidInputError(f"unknown column type {text!r}; known: {known}, decimal(p,s)")


def parse_schema(spec: str) -> pa.Schema:
    """``id:int64,name:string`` or a JSON file: a list of ``{name, type, nullable}`` (what ``describe``
    prints under ``columns``), an object holding such a list under ``columns``, or a Spark StructType."""
    if os.path.isfile(spec):
        with open(spec) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"schema file {spec} is not valid JSON: {e}") from None
        if isinstance(doc, dict) and doc.get("type") == "struct":
            return _struct_type_schema(doc)
        columns = doc.get("columns") if isinstance(doc, dict) else doc
        if not isinstance(columns, list) or not all(isinstance(c, dict) and "name" in c and "type" in c
                                                    for c in columns):
            raise InvalidInputError(f"schema file {spec} holds no list of {{name, type}} columns")
        return pa.schema([pa.field(c["name"], parse_type(c["type"]), c.get("nullable", True))
                          for c in columns])
    fields = []
    for item in re.split(r",(?![^(]*\))", spec):  # not the comma of decimal(p,s)
        name, sep, type_name = item.partition(":")
        if not sep or not name.strip():
            raise InvalidInputError(f"schema item {item!r} is not name:type (and {spec!r} is not a file)")
        fields.append(pa.field(name.strip(), parse_type(type_name)))
    return pa.schema(fields)


def _struct_type_schema(doc: dict) -> pa.Schema:
    """A Spark StructType's JSON (``df.schema.json()``): read here when every column has a simple type (``long``,
    ``decimal(10,2)``…); one with nested types is read by pyspark."""
    fields = doc.get("fields")
    if isinstance(fields, list) and all(isinstance(f, dict) and isinstance(f.get("type"), str) and "name" in f
                                        for f in fields):
        return pa.schema([pa.field(f["name"], parse_type(f["type"]), f.get("nullable", True)) for f in fields])
    try:
        from pyspark.sql.types import StructType
    except ImportError:
        raise InvalidInputError("a schema file of a Spark StructType with nested types is read by pyspark: "
                                "pip install 'bitlake[spark]'") from None
    return to_arrow_schema(StructType.fromJson(doc))
