"""SQL expressions without Spark (docs/dml.md#expressions): a condition or a value written as in Spark SQL or
delta-rs (``"region = 'EU' and amount < 0"``, ``"source.bal * 2"``, ``"'fixed'"``) becomes a pyarrow compute
expression, which the reader pushes into the files (row groups and partitions its statistics rule out are skipped)
and pyarrow evaluates on Arrow.

sqlglot parses (in Spark's dialect); this module compiles the parsed tree to pyarrow, node by node, and refuses by
name what it does not know rather than guess. Why not DataFusion or DuckDB: both evaluate SQL well, but only over a
table they hold; a pyarrow expression is what the scan of every engine takes (pyarrow's dataset scanner, and DuckDB
and Polars through it), so one compiled condition filters files, row groups and rows on the way in.

Names resolve in a :class:`Scope`: a table's columns, or in a merge, the source's and the target's columns under
their aliases (``source.id``); an unqualified name both sides have is refused as ambiguous. Names are matched
exactly, else without regard to case (as Spark does) when that is unique. Types follow SQL where pyarrow differs:
``/`` divides as floating point, ``%`` is the remainder with the dividend's sign, a string literal compared with
a date, timestamp or number is read as that type (``d >= '2024-01-01'``), a timestamp without zone compared
with a zoned column is UTC, NaN equals NaN and is greater than any other number, ``x IN (..., NULL)`` is true or
unknown, and numbers of mixed kinds meet as Spark widens them. Errors follow Spark's ANSI mode (Spark 4's
default): division by zero and a CAST whose value does not convert raise (sqlglot reads CAST as TRY_CAST, but an
unsafe pyarrow cast would wrap rather than give null). tests/test_sql_oracle.py checks all this against DuckDB.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import sqlglot
from sqlglot import exp

from bitlake.errors import InvalidInputError


class Scope:
    """The columns an expression may name: ``fields`` maps each qualifier ("" for unqualified-only names) to the
    schema's field name of each column, as in ``{"source": {"id": "source.id"}, "target": {...}}``."""

    def __init__(self, schema: pa.Schema, fields: dict[str, dict[str, str]]):
        self.schema = schema
        self.fields = fields

    @classmethod
    def of(cls, schema: pa.Schema) -> Scope:
        """A table's columns, unqualified."""
        return cls(schema, {"": {n: n for n in schema.names}})

    def resolve(self, qualifier: str, name: str, text: str) -> str:
        if qualifier:
            table = _match(self.fields, qualifier) if qualifier not in self.fields else qualifier
            if table is None or table == "":
                known = sorted(q for q in self.fields if q)
                raise InvalidInputError(f"{text!r}: unknown table {qualifier!r} in {qualifier}.{name}"
                                        + (f"; name columns as {' or '.join(q + '.<column>' for q in known)}"
                                           if known else "; name the table's columns without a qualifier"))
            column = _match(self.fields[table], name)
            if column is None:
                raise InvalidInputError(f"{text!r}: {table} has no column {name!r}; its columns are "
                                        f"{list(self.fields[table])}")
            return self.fields[table][column]
        found = [(q, c) for q, cols in self.fields.items() for c in [_match(cols, name)] if c is not None]
        if len(found) > 1:
            raise InvalidInputError(f"{text!r}: column {name!r} is ambiguous: qualify it as "
                                    f"{' or '.join(f'{q}.{name}' for q, _ in found)}")
        if not found:
            columns = sorted({f"{q}.{c}" if q else c for q, cols in self.fields.items() for c in cols})
            raise InvalidInputError(f"{text!r}: no column {name!r} (a string value is written in quotes: "
                                    f"'{name}'); the columns are {columns}")
        q, c = found[0]
        return self.fields[q][c]


def _match(names, name: str) -> str | None:
    """``name`` among ``names``: exactly, else without regard to case when that is unique."""
    if name in names:
        return name
    folded = [n for n in names if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def to_expression(text: str, scope: Scope | pa.Schema, *, what: str = "condition") -> pc.Expression:
    """The pyarrow expression of the SQL expression ``text`` over ``scope``'s columns (a schema: a table's)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError(f"a SQL {what} must be a non-empty string, not {text!r}")
    if isinstance(scope, pa.Schema):
        scope = Scope.of(scope)
    tree = parse(text)
    out = _Compiler(scope, text).compile(tree)
    if what == "condition" and not pa.types.is_boolean(_Compiler(scope, text).type_of(out)):
        raise InvalidInputError(f"{text!r} is not a condition (it does not give true or false)")
    return out


def type_of(e: pc.Expression, scope: Scope) -> pa.DataType:
    """The type the expression ``e`` over ``scope``'s columns gives."""
    return _Compiler(scope, str(e)).type_of(e)


@functools.lru_cache(maxsize=256)
def parse(text: str) -> exp.Expr:
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.ParseError as e:
        raise InvalidInputError(f"{text!r} is not a SQL expression: {str(e).splitlines()[0]}") from None
    if isinstance(tree, exp.Query | exp.Command | exp.DDL | exp.DML):
        raise InvalidInputError(f"{text!r} is a statement, not an expression")
    return tree


def conjuncts(tree: exp.Expr) -> list[exp.Expr]:
    """The parts of ``a AND b AND ...``."""
    tree = tree.unnest() if isinstance(tree, exp.Paren) else tree
    if isinstance(tree, exp.And):
        return [*conjuncts(tree.this), *conjuncts(tree.expression)]
    return [tree]


def column_of(node: exp.Expr) -> tuple[str, str] | None:
    """``(qualifier, name)`` when ``node`` is a bare column reference."""
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        return node.table or "", node.name
    return None


_COMPARE: dict[type, Any] = {exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater, exp.GTE: pc.greater_equal,
            exp.LT: pc.less, exp.LTE: pc.less_equal}
_ARITHMETIC = {exp.Add: pc.add_checked, exp.Sub: pc.subtract_checked, exp.Mul: pc.multiply_checked}
# Functions by sqlglot's node (or, for those it keeps anonymous, the lower-case name) and their pyarrow kernel.
_FUNCTIONS: dict[type, Any] = {
    exp.Lower: pc.utf8_lower, exp.Upper: pc.utf8_upper, exp.Length: pc.utf8_length, exp.Abs: pc.abs,
    exp.Floor: pc.floor, exp.Ceil: pc.ceil, exp.Year: pc.year, exp.Month: pc.month, exp.Day: pc.day,
    exp.Trim: pc.utf8_trim_whitespace}
_TYPES = {"BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(),
          "BIGINT": pa.int64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
          "TEXT": pa.string(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", "UTC"),
          "TIMESTAMPTZ": pa.timestamp("us", "UTC"), "TIMESTAMPLTZ": pa.timestamp("us", "UTC"),
          "TIMESTAMPNTZ": pa.timestamp("us"), "DATETIME": pa.timestamp("us"), "BINARY": pa.binary()}
SUPPORTED = ("comparisons (= <> != < <= > >= <=>), AND, OR, NOT, IS [NOT] NULL, IS [NOT] TRUE/FALSE, [NOT] IN (...), "
             "[NOT] BETWEEN, [NOT] LIKE/ILIKE, + - * / %, ||, CASE, IF, COALESCE, NULLIF, CAST, DATE '...', "
             "TIMESTAMP '...', lower, upper, length, trim, abs, floor, ceil, round, year, month, day, "
             "starts_with, ends_with, contains")


class _Compiler:
    def __init__(self, scope: Scope, text: str):
        self.scope, self.text = scope, text

    def fail(self, node: exp.Expr, why: str = "") -> InvalidInputError:
        why = why or f"{node.sql(dialect='spark')!r} is not supported"
        return InvalidInputError(f"{self.text!r}: {why} without Spark (supported: {SUPPORTED}; or pass spark= to "
                                 "run it in Spark SQL)")

    def type_of(self, e: pc.Expression) -> pa.DataType:
        """The type ``e`` gives: evaluated over no rows of the scope's schema."""
        try:
            return ds.dataset(self.scope.schema.empty_table()).to_table(columns={"_": e}).schema.field(0).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
            raise InvalidInputError(f"{self.text!r}: {str(err).splitlines()[0]}") from None

    def compile(self, node: exp.Expr) -> pc.Expression:
        if node.args.get("negate"):  # NOT LIKE, NOT IN, NOT BETWEEN
            inner = node.copy()
            inner.set("negate", False)
            return ~self.compile(inner)
        for kind in _COMPARE:
            if isinstance(node, kind):
                return self.compare(kind, *self.comparable(node.this, node.expression))
        for kind, fn in _ARITHMETIC.items():
            if isinstance(node, kind):
                return fn(*self.numeric(self.literal_digits([node.this, node.expression])))
        c = self.compile
        match node:
            case exp.Paren():
                return c(node.this)
            case exp.Column() if isinstance(node.this, exp.Identifier):
                return pc.field(self.scope.resolve(node.table or "", node.name, self.text))
            case exp.Boolean():
                return pc.scalar(node.this)
            case exp.Null():
                return pc.scalar(None)
            case exp.Literal():
                return pc.scalar(_literal(node))
            case exp.Neg():
                return pc.negate_checked(c(node.this))
            case exp.And():
                return c(node.this) & c(node.expression)
            case exp.Or():
                return c(node.this) | c(node.expression)
            case exp.Not():
                return ~c(node.this)
            case exp.NullSafeEQ():
                left, right = self.comparable(node.this, node.expression)
                both = left.is_null() & right.is_null()
                return both | (~left.is_null() & ~right.is_null() & _known(self.compare(exp.EQ, left, right)))
            case exp.Div():  # by zero: an error, as in Spark's ANSI mode (not pyarrow's inf or NaN)
                return pc.divide_checked(c(node.this).cast(pa.float64()), c(node.expression).cast(pa.float64()))
            case exp.Mod():
                return pc.remainder_checked(*self.numeric([c(node.this), c(node.expression)]))
            case exp.DPipe():
                return pc.binary_join_element_wise(self.to_string(node, c(node.this)),
                                                   self.to_string(node, c(node.expression)), "")
            case exp.Is():
                return self.is_(node)
            case exp.In():
                return self.in_(node)
            case exp.Between():
                value, low = self.comparable(node.this, node.args["low"])
                _, high = self.comparable(node.this, node.args["high"])
                return self.compare(exp.GTE, value, low) & self.compare(exp.LTE, value, high)
            case exp.Like() | exp.ILike():
                pattern = node.expression
                if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                    raise self.fail(node, "LIKE takes a string pattern")
                return pc.match_like(c(node.this), pattern.this, ignore_case=isinstance(node, exp.ILike))
            case exp.Cast() | exp.TryCast():
                return self.cast(node)
            case exp.Case():
                return self.case(node)
            case exp.If():
                return pc.if_else(_known(c(node.this)), *self.unified(
                    [c(node.args["true"]), c(node.args["false"]) if node.args.get("false") else pc.scalar(None)]))
            case exp.Coalesce():
                return pc.coalesce(*self.comparable_all([node.this, *node.expressions]))
            case exp.Nullif():
                value, other = self.comparable(node.this, node.expression)
                return pc.if_else(_known(self.compare(exp.EQ, value, other)), pc.scalar(None).cast(
                    self.type_of(value)), value)
            case exp.Round():
                digits = node.args.get("decimals")
                return pc.round(c(node.this), int(_literal(digits)) if digits is not None else 0,
                                round_mode="half_up")
            case exp.Anonymous() | exp.StartsWith() | exp.EndsWith():
                return self.function(node)
        for function, kernel in _FUNCTIONS.items():
            if isinstance(node, function):
                return kernel(c(node.this))
        raise self.fail(node)

    def function(self, node: exp.Expr) -> pc.Expression:
        name = node.name.lower() if isinstance(node, exp.Anonymous) else type(node).__name__.lower()
        args = node.expressions if isinstance(node, exp.Anonymous) else [node.this, node.expression]
        patterns = {"startswith": pc.starts_with, "starts_with": pc.starts_with, "endswith": pc.ends_with,
                    "ends_with": pc.ends_with, "contains": pc.match_substring}
        if name in patterns and len(args) == 2 and isinstance(args[1], exp.Literal) and args[1].is_string:
            return patterns[name](self.compile(args[0]), args[1].this)
        raise self.fail(node, f"function {name}() is not supported" if name not in patterns
                        else f"{name}() takes a column and a string literal")

    def compare(self, kind: type, left: pc.Expression, right: pc.Expression) -> pc.Expression:
        """``left <op> right`` as Spark compares: NaN equals NaN and is greater than any other number (pyarrow:
        NaN equals nothing and is neither less nor greater), null unknown."""
        fn = _COMPARE[kind]
        floating = [pa.types.is_floating(self.type_of(e)) for e in (left, right)]
        if not any(floating):
            return fn(left, right)
        # Against a number that is not NaN, pyarrow's answer is Spark's but that NaN is greater: the comparison
        # stays one the scan can prune row groups by (an if_else below is not).
        if _plain_number(right) or _plain_number(left):
            nan = _known(pc.is_nan(left if _plain_number(right) else right))
            greater = (exp.GT, exp.GTE) if _plain_number(right) else (exp.LT, exp.LTE)
            return fn(left, right) | nan if kind in greater else fn(left, right)
        no = pc.scalar(False)
        a_nan = _known(pc.is_nan(left)) if floating[0] else no
        b_nan = _known(pc.is_nan(right)) if floating[1] else no
        by_kind: dict[type, pc.Expression] = {exp.EQ: a_nan & b_nan, exp.NEQ: ~(a_nan & b_nan), exp.LT: ~a_nan & b_nan,
                                              exp.LTE: b_nan, exp.GT: a_nan & ~b_nan, exp.GTE: a_nan}
        on_nan = by_kind[kind]
        out = pc.if_else(a_nan | b_nan, on_nan, fn(left, right))
        return pc.if_else(left.is_valid() & right.is_valid(), out, pc.scalar(pa.scalar(None, pa.bool_())))

    def to_string(self, node: exp.Expr, e: pc.Expression) -> pc.Expression:
        """``e`` as a string, as Spark writes it; a floating-point or timestamp value is refused (pyarrow writes
        1.0 as '1' and a timestamp with its zone, Spark '1.0' and the session's time)."""
        t = self.type_of(e)
        if pa.types.is_floating(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_binary(t):
            raise self.fail(node, f"a {t} value as a string ({node.sql(dialect='spark')!r}) is not supported: "
                                  "pyarrow does not write it as Spark does")
        return e.cast(pa.string())

    def comparable(self, a: exp.Expr, b: exp.Expr) -> tuple[pc.Expression, pc.Expression]:
        left, right = self.comparable_all([a, b])
        return left, right

    def comparable_all(self, nodes: list[exp.Expr]) -> list[pc.Expression]:
        """The expressions of ``nodes``, a string literal among them read as the type of the first of the others
        that is not a string (``d >= '2024-01-01'`` on a date), and a temporal operand cast to a zoned
        timestamp's type."""
        out = [self.compile(n) for n in nodes]
        types = [None if _is_string_literal(n) or isinstance(n, exp.Null) else self.type_of(e)
                 for n, e in zip(nodes, out, strict=True)]
        target = next((t for t in types if t is not None and not pa.types.is_string(t)
                       and not pa.types.is_large_string(t) and not pa.types.is_null(t)), None)
        if target is None:
            return out
        for i, n in enumerate(nodes):
            if _is_string_literal(n):
                out[i] = pc.scalar(_read_as(n.this, target, self.text))
            elif types[i] is not None and pa.types.is_temporal(target) and pa.types.is_temporal(types[i]) \
                    and types[i] != target:
                out[i] = out[i].cast(target)
        return self.numeric(out)

    def literal_digits(self, nodes: list[exp.Expr]) -> list[pc.Expression]:
        """The operands of an arithmetic operator; beside a decimal, an integer is a decimal of its digits, as Spark
        types it (``amount * 2``: decimal(1, 0); an int64 column: decimal(20, 0)), not the decimal both would
        meet in, whose product with a decimal(10, 2) would need 45 digits."""
        out = [self.compile(n) for n in nodes]
        types = [self.type_of(e) for e in out]
        if any(pa.types.is_decimal(t) for t in types):
            for i, (n, t) in enumerate(zip(nodes, types, strict=True)):
                if isinstance(n, exp.Literal) and not n.is_string and isinstance(value := _literal(n), int):
                    digits = max(1, len(str(abs(value))))
                    out[i] = pc.scalar(pa.scalar(decimal.Decimal(value), pa.decimal128(digits, 0)))
                elif pa.types.is_integer(t):
                    out[i] = out[i].cast(pa.decimal128(_INTEGER_DIGITS[t.bit_width // 8], 0))
        return out

    def numeric(self, values: list[pc.Expression]) -> list[pc.Expression]:
        """``values`` cast to one numeric type when they mix kinds, as Spark widens: with a float, double (an
        integer as big as 2**40 included, which pyarrow's implicit cast refuses); integers with a decimal, a
        decimal that holds both."""
        types = [self.type_of(v) for v in values]
        target = _common_numeric(types)
        if target is None:
            return values
        return [v if t == target or pa.types.is_null(t) else v.cast(target, safe=not pa.types.is_integer(t))
                for v, t in zip(values, types, strict=True)]

    def is_(self, node: exp.Is) -> pc.Expression:
        value, what = self.compile(node.this), node.expression
        if isinstance(what, exp.Null):
            return value.is_null()
        if isinstance(what, exp.Boolean):
            return _known(pc.equal(value, pc.scalar(what.this)))
        raise self.fail(node, "IS takes NULL, TRUE or FALSE")

    def in_(self, node: exp.In) -> pc.Expression:
        if node.args.get("query") or node.args.get("unnest") or not node.expressions:
            raise self.fail(node, "IN takes a list of values")
        values = node.expressions
        if not all(isinstance(v, exp.Literal | exp.Null | exp.Neg | exp.Cast | exp.Boolean) for v in values):
            # Not every value a constant: a disjunction of comparisons.
            value = node.this
            out = None
            for v in values:
                left, right = self.comparable(value, v)
                equal = self.compare(exp.EQ, left, right)
                out = equal if out is None else out | equal
            return out
        compiled = self.comparable_all([node.this, *values])
        field, constants = compiled[0], compiled[1:]
        target = self.type_of(field)
        python = [_constant(e, self) for e in constants]
        # x IN (..., NULL): true where x is in the list, else unknown (SQL); pyarrow's isin would match a null x.
        unknown = pc.scalar(pa.scalar(None, pa.bool_())) if any(v is None for v in python) else None
        python = [v for v in python if v is not None]
        if not python:
            return pc.if_else(field.is_valid(), unknown, unknown)  # null, whatever x is
        if pa.types.is_floating(target):  # -0.0 IN (0.0) is true, as -0.0 = 0.0 (isin hashes them apart)
            field = pc.add(field, pc.scalar(0.0).cast(target))
            python = [v + 0.0 if isinstance(v, float) else v for v in python]
        if pa.types.is_floating(target) and any(isinstance(v, float) and v != v for v in python):
            raise self.fail(node, "NaN in an IN list is not supported")
        if pa.types.is_integer(target) and any(isinstance(v, float | decimal.Decimal) for v in python):
            target = pa.float64()  # i IN (1.5): compared as doubles, as Spark
            field = field.cast(target)
        if pa.types.is_decimal(target):
            python = [decimal.Decimal(str(v)) if isinstance(v, float | int) else v for v in python]
        try:
            array = pa.array(python).cast(target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"{self.text!r}: the IN list does not match the column's type {target}: "
                                    f"{str(e).splitlines()[0]}") from None
        # null IN (...) is unknown, as in SQL (isin says false): an equality with one of the values brings the null.
        found = field.isin(array)
        if unknown is not None:
            return found | unknown
        return found | pc.equal(field, pc.scalar(array[0]))

    def cast(self, node: exp.Cast) -> pc.Expression:
        to = node.args["to"]
        target = _TYPES.get(to.this.name)
        if to.this.name == "DECIMAL":
            params = [int(_literal(p.this)) for p in to.expressions]
            target = pa.decimal128(*(params or [10, 0]))
        if target is None:
            raise self.fail(node, f"CAST to {to.sql()} is not supported")
        if _is_string_literal(node.this):  # DATE '...', TIMESTAMP '...'
            return pc.scalar(_read_as(node.this.this, target, self.text))
        # sqlglot reads Spark's CAST as TryCast (Spark's legacy mode, null where a value does not convert); an
        # unsafe pyarrow cast would wrap or give garbage instead, so a value that does not convert is an error, as
        # in Spark's ANSI mode (TRY_CAST included: pyarrow cannot give null for it).
        value = self.compile(node.this)
        source = self.type_of(value)
        if pa.types.is_string(target):
            return self.to_string(node, value)
        if pa.types.is_integer(target) and (pa.types.is_floating(source) or pa.types.is_decimal(source)):
            value = pc.trunc(value) if pa.types.is_floating(source) else pc.round(value, 0, round_mode="towards_zero")
        return value.cast(target, safe=True)

    def case(self, node: exp.Case) -> pc.Expression:
        ifs = node.args["ifs"]
        subject = node.this
        conditions = []
        for branch in ifs:
            condition = self.compile(exp.EQ(this=subject, expression=branch.this) if subject else branch.this)
            conditions.append(_known(condition))
        default = node.args.get("default")
        values = self.unified([*(self.compile(b.args["true"]) for b in ifs),
                               self.compile(default) if default is not None else pc.scalar(None)])
        names = [f"c{i}" for i in range(len(conditions))]
        return pc.case_when(pc.make_struct(*conditions, field_names=names), *values)

    def unified(self, values: list[pc.Expression]) -> list[pc.Expression]:
        """``values`` (the branches of a CASE or IF) cast to one type: the one they share, null taking it, or
        float64 / int64 for a mix of numbers."""
        types = [self.type_of(v) for v in values]
        known = {t for t in types if not pa.types.is_null(t)}
        if len(known) > 1 and all(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                                  for t in known):
            known = {pa.float64() if any(not pa.types.is_integer(t) for t in known) else pa.int64()}
        if len(known) != 1:
            return values
        target = known.pop()
        return [v if t == target else v.cast(target) for v, t in zip(values, types, strict=True)]


_INTEGER_DIGITS = {1: 3, 2: 5, 4: 10, 8: 20}


def _common_numeric(types: list[pa.DataType]) -> pa.DataType | None:
    """The type numbers of ``types`` mixing floats, decimals and integers meet in; None when they do not mix."""
    numbers = [t for t in types if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)]
    kinds = {("f" if pa.types.is_floating(t) else "d" if pa.types.is_decimal(t) else "i") for t in numbers}
    if len(kinds) < 2:
        return None
    if "f" in kinds:
        return pa.float64()
    scale = max(t.scale for t in numbers if pa.types.is_decimal(t))
    digits = max(t.precision - t.scale if pa.types.is_decimal(t) else _INTEGER_DIGITS[t.bit_width // 8]
                 for t in numbers)
    return pa.decimal128(min(38, digits + scale), scale)


def _known(condition: pc.Expression) -> pc.Expression:
    """``condition`` with null (unknown) read as false."""
    return pc.coalesce(condition, pc.scalar(False))


def _is_string_literal(node: exp.Expr) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


def _literal(node: exp.Expr) -> Any:
    if isinstance(node, exp.Neg):
        return -_literal(node.this)
    if not isinstance(node, exp.Literal):
        raise InvalidInputError(f"expected a literal, not {node.sql()!r}")
    if node.is_string:
        return node.this
    text = node.this
    if any(ch in text for ch in ".eE"):
        return float(text) if "e" in text.lower() else decimal.Decimal(text) if len(text) > 17 else float(text)
    return int(text)


def _plain_number(e: pc.Expression) -> bool:
    """Whether ``e`` is a constant number that is neither null nor NaN."""
    try:
        value = _constant(e, None)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False  # it names a column
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool) and value == value


def _constant(e: pc.Expression, compiler: _Compiler | None) -> Any:
    """The Python value of a constant expression."""
    table = ds.dataset(pa.table({"_": [0]})).to_table(columns={"v": e})
    return table.column(0)[0].as_py()


def _read_as(text: str, target: pa.DataType, sql: str) -> pa.Scalar:
    """A string literal as a value of ``target`` (a date, timestamp, number...)."""
    try:
        if pa.types.is_timestamp(target):
            value = dt.datetime.fromisoformat(text.strip())
            if target.tz is not None and value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            if target.tz is None and value.tzinfo is not None:
                value = value.astimezone(dt.UTC).replace(tzinfo=None)
            return pa.scalar(value, target)
        if pa.types.is_date(target):
            return pa.scalar(dt.date.fromisoformat(text.strip()), target)
        return pa.scalar(text).cast(target)
    except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"{sql!r}: {text!r} is not a value of type {target}: {str(e).splitlines()[0]}") \
            from None
