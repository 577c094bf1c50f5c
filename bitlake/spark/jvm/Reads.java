package io.bitlake.spark;

import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.WeakHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Reads of bitlake tables as Spark's own plans: the planner's whole files scanned as they are, its filtered files
 * scanned and filtered by {@link KeepRow}, the union filtered by the planner's conditions (event time,
 * tombstones), under the relation's attributes, so the optimizer prunes columns and pushes filters into the
 * scans as it does for any Parquet table (what bitlake/spark/reader.py builds in Python).
 */
final class Reads {
    /** The data source's tables whose reads stay the Python data source's (on stores Spark's JVM cannot read), so
     * the analyzer's every pass does not plan them again. */
    private static final Map<Table, Boolean> PYTHON_READS = Collections.synchronizedMap(new WeakHashMap<>());

    private Reads() {
    }

    /** Whether {@code relation} reads a bitlake table: one of the catalog's, or {@code format("bitlake")}'s. */
    static boolean isRead(DataSourceV2Relation relation) {
        Table t = relation.table();
        if (t instanceof BitlakeTable) {
            return true;
        }
        return t instanceof PythonTable && Catalog.PROVIDER.equalsIgnoreCase(t.name()) && !PYTHON_READS.containsKey(t)
                && !"true".equalsIgnoreCase(relation.options().getOrDefault("readChangeFeed", "false").trim());
    }

    /** The plan of the read, or null to keep the relation (a table Spark's JVM cannot read: the Python data
     * source reads it through bitlake's FileIO). */
    static LogicalPlan plan(SparkSession session, DataSourceV2Relation relation) {
        JsonNode read;
        if (relation.table() instanceof BitlakeTable b) {
            read = b.read;
            String validAt = relation.options().get("validAt");  // SELECT ... FROM name WITH ('validAt' = '...')
            if (validAt != null) {
                read = BitlakeTable.plan(b.uri, b.storage, read.get("version").asText(), null, null, validAt);
            }
            if (!read.get("spark_readable").asBoolean()) {
                throw new IllegalArgumentException("bitlake: Spark's JVM cannot read " + b.uri + " (an object store "
                        + "without a Hadoop connector): read it with spark.read.format(\"bitlake\") or Table.to_spark");
            }
        } else {
            Map<String, String> options = relation.options().asCaseSensitiveMap();
            String path = relation.options().get("path");
            if (path == null) {
                return null;  // the Python data source names the missing path
            }
            read = BitlakeTable.plan(path, BitlakeTable.storageOptions(options), relation.options().get("versionAsOf"),
                    null, relation.options().get("timestampAsOf"), relation.options().get("validAt"));
            if (!read.get("spark_readable").asBoolean()) {
                PYTHON_READS.put(relation.table(), true);
                return null;
            }
        }
        return project(relation, rows(session, read));
    }

    static org.apache.spark.sql.Dataset<Row> rows(SparkSession session, JsonNode read) {
        StructType schema = (StructType) DataType.fromJson(read.get("schema").asText());
        String format = read.get("format").asText();
        List<org.apache.spark.sql.Dataset<Row>> parts = new ArrayList<>();
        String[] whole = strings(read.get("whole"));
        if (whole.length > 0) {
            parts.add(session.read().format(format).schema(schema).load(whole));
        }
        String[] filtered = strings(read.get("filtered"));
        if (filtered.length > 0) {
            byte[] dropped = Base64.getDecoder().decode(read.get("keep").asText());
            Column keep = functions.udf(new KeepRow(), DataTypes.BooleanType).withName(KeepLast.NAME)
                    .apply(functions.lit(dropped), functions.expr(read.get("row_id").asText()));
            parts.add(session.read().format(format).schema(schema).load(filtered).filter(keep));
        }
        org.apache.spark.sql.Dataset<Row> out = parts.isEmpty() ? session.createDataFrame(List.of(), schema)
                : parts.get(0);
        for (int i = 1; i < parts.size(); i++) {
            out = out.unionByName(parts.get(i));
        }
        for (JsonNode condition : read.get("conditions")) {
            out = out.filter(functions.expr(condition.asText()));
        }
        return out;
    }

    /** {@code rows} under the relation's attributes (its names, types and expression ids), which the plan's other
     * operators refer to. */
    static LogicalPlan project(DataSourceV2Relation relation, org.apache.spark.sql.Dataset<Row> rows) {
        List<AttributeReference> attrs = CollectionConverters.asJava(relation.output());
        Column[] columns = new Column[attrs.size()];
        for (int i = 0; i < columns.length; i++) {
            AttributeReference a = attrs.get(i);
            columns[i] = functions.col(quote(a.name())).cast(a.dataType()).as(a.name());
        }
        LogicalPlan child = ((Dataset<Row>) rows.select(columns)).logicalPlan();
        List<Attribute> out = CollectionConverters.asJava(child.output());
        List<NamedExpression> aliases = new ArrayList<>();
        for (int i = 0; i < columns.length; i++) {
            AttributeReference a = attrs.get(i);
            aliases.add(new Alias(out.get(i), a.name(), a.exprId(), Rules.seq(List.of()), Option.<Metadata>empty(),
                    Rules.seq(List.of())));
        }
        return new Project(Rules.seq(aliases), child);
    }

    static String quote(String name) {
        return "`" + name.replace("`", "``") + "`";
    }

    static String[] strings(JsonNode array) {
        String[] out = new String[array.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = array.get(i).asText();
        }
        return out;
    }
}
