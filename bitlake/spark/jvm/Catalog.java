package io.bitlake.spark;

import java.util.HashMap;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.connector.catalog.CatalogV2Util;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.DelegatingCatalogExtension;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableInfo;
import org.apache.spark.sql.connector.expressions.Transform;

/**
 * The session catalog with bitlake tables ({@code spark.sql.catalog.spark_catalog}, as Delta's): a table created
 * {@code USING bitlake LOCATION '<uri>'} (an existing table, or a new one of the statement's columns) is kept in the
 * session's catalog and loaded as a {@link BitlakeTable},
 * at a version ({@code VERSION AS OF}) or a time ({@code TIMESTAMP AS OF}) too; {@code bitlake.`<uri>`} names a
 * table by its location. Every other table is the session catalog's.
 */
public class Catalog extends DelegatingCatalogExtension {
    static final String PROVIDER = "bitlake";

    static boolean isPath(Identifier ident) {
        return ident.namespace().length == 1 && ident.namespace()[0].equalsIgnoreCase(PROVIDER)
                && (ident.name().startsWith("/") || ident.name().contains("://"));
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        return bitlake(ident, null, null);
    }

    @Override
    public Table loadTable(Identifier ident, String version) throws NoSuchTableException {
        return bitlake(ident, version, null);
    }

    @Override
    public Table loadTable(Identifier ident, long timestamp) throws NoSuchTableException {
        return bitlake(ident, null, timestamp);
    }

    private Table bitlake(Identifier ident, String version, Long timestamp) throws NoSuchTableException {
        if (isPath(ident)) {
            return BitlakeTable.load(ident.name(), Map.of(), version, timestamp, null, null);
        }
        Table t = super.loadTable(ident);
        if (!isBitlake(t.properties())) {
            return version != null ? super.loadTable(ident, version)
                    : timestamp != null ? super.loadTable(ident, timestamp) : t;
        }
        return BitlakeTable.load(location(t.properties()), options(t.properties()), version, timestamp, null, null);
    }

    /** A new bitlake table at {@code location} of the statement's columns and identity partitions; its
     * {@code TBLPROPERTIES} {@code primary_key} (columns, comma-separated) and {@code delta_column} make it keyed,
     * the others are bitlake's table properties ({@code bitlake.create_table}). */
    private static void create(String location, Column[] columns, Transform[] partitions,
                               Map<String, String> properties) {
        ObjectNode request = BitlakeTable.request("create", location, options(properties));
        request.put("schema", CatalogV2Util.v2ColumnsToStructType(columns).json());
        ArrayNode partitionBy = request.putArray("partition_by");
        for (Transform t : partitions) {
            if (!"identity".equals(t.name()) || t.references().length != 1) {
                throw new IllegalArgumentException("a bitlake table is partitioned by columns' values, not by "
                        + t.describe());
            }
            partitionBy.add(String.join(".", t.references()[0].fieldNames()));
        }
        ObjectNode own = request.putObject("properties");
        properties.forEach((k, v) -> {
            if (!RESERVED.contains(k) && !k.startsWith(TableCatalog.OPTION_PREFIX)) {
                own.put(k, v);
            }
        });
        Planner.call(request);
    }

    private static final Set<String> RESERVED = Set.of(TableCatalog.PROP_LOCATION,
            TableCatalog.PROP_IS_MANAGED_LOCATION, TableCatalog.PROP_EXTERNAL, TableCatalog.PROP_TABLE_TYPE,
            TableCatalog.PROP_COMMENT, TableCatalog.PROP_COLLATION, TableCatalog.PROP_PROVIDER,
            TableCatalog.PROP_OWNER);

    static boolean isBitlake(Map<String, String> properties) {
        return PROVIDER.equalsIgnoreCase(properties.get(TableCatalog.PROP_PROVIDER));
    }

    private static String location(Map<String, String> properties) {
        String location = properties.get(TableCatalog.PROP_LOCATION);
        if (location == null) {
            throw new IllegalArgumentException("a bitlake table needs its location: CREATE TABLE ... USING bitlake "
                    + "LOCATION '<table uri>'");
        }
        return location;
    }

    /** The table's storage options: its {@code OPTIONS ('storage.<KEY>' ...)}. */
    private static Map<String, String> options(Map<String, String> properties) {
        Map<String, String> options = new HashMap<>();
        properties.forEach((k, v) -> {
            if (k.startsWith(TableCatalog.OPTION_PREFIX)) {
                options.put(k.substring(TableCatalog.OPTION_PREFIX.length()), v);
            }
        });
        return BitlakeTable.storageOptions(options);
    }

    @Override
    public Table createTable(Identifier ident, TableInfo info)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        return createTable(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    public Table createTable(Identifier ident, Column[] columns, Transform[] partitions,
                             Map<String, String> properties)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        if (!isBitlake(properties)) {
            return super.createTable(ident, columns, partitions, properties);
        }
        String location = location(properties);
        if (columns.length > 0) {
            create(location, columns, partitions, properties);
        } else if (partitions.length > 0) {
            throw new IllegalArgumentException("CREATE TABLE ... USING bitlake of an existing table takes no "
                    + "PARTITIONED BY: the table's partitioning is its own");
        }
        JsonNode read = BitlakeTable.plan(location, options(properties), null, null, null, null);
        Map<String, String> kept = new HashMap<>(properties);
        kept.put(TableCatalog.PROP_LOCATION, read.get("uri").asText());
        super.createTable(ident, new Column[0], new Transform[0], kept);
        try {
            return loadTable(ident);
        } catch (NoSuchTableException e) {
            throw new IllegalStateException(e);
        }
    }
}
