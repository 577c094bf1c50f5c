package io.bitlake.spark;

import java.util.EnumSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableSummary;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A view of a bitlake table (a version, a time, an event time) as the catalog hands it to Spark: its schema and
 * the planner's description of its read, taken once when the table is loaded, so a query reads one snapshot.
 * {@link Rules} replaces its relation by Spark's own scans of the plan's files; scanning it otherwise is refused.
 */
public final class BitlakeTable implements SupportsRead {
    final String uri;
    final Map<String, String> storage;
    final JsonNode read;

    private BitlakeTable(String uri, Map<String, String> storage, JsonNode read) {
        this.uri = uri;
        this.storage = storage;
        this.read = read;
    }

    /** The view of the table at {@code uri}: {@code version}, {@code timestampMicros} or {@code asOf} (any may be
     * null: the latest), at event time {@code validAt} (null: current). */
    static BitlakeTable load(String uri, Map<String, String> storage, String version, Long timestampMicros,
                             String asOf, String validAt) {
        return new BitlakeTable(uri, storage, plan(uri, storage, version, timestampMicros, asOf, validAt));
    }

    static JsonNode plan(String uri, Map<String, String> storage, String version, Long timestampMicros,
                         String asOf, String validAt) {
        ObjectNode request = Planner.request("plan").put("uri", uri).put("version", version)
                .put("timestamp_us", timestampMicros).put("as_of", asOf).put("valid_at", validAt);
        ObjectNode options = request.putObject("storage");
        storage.forEach(options::put);
        return Planner.call(request);
    }

    static ObjectNode request(String op, String uri, Map<String, String> storage) {
        ObjectNode request = Planner.request(op).put("uri", uri);
        ObjectNode options = request.putObject("storage");
        storage.forEach(options::put);
        return request;
    }

    /** The storage options among a data source's options ({@code storage.<KEY>}). */
    static Map<String, String> storageOptions(Map<String, String> options) {
        Map<String, String> out = new TreeMap<>();
        options.forEach((key, value) -> {
            if (key.toLowerCase(Locale.ROOT).startsWith("storage.")) {
                out.put(key.substring("storage.".length()), value);
            }
        });
        return out;
    }

    @Override
    public String name() {
        return "bitlake:" + uri + "@" + read.get("version").asText();
    }

    @Override
    public Map<String, String> properties() {
        return Map.of(TableCatalog.PROP_PROVIDER, Catalog.PROVIDER, TableCatalog.PROP_LOCATION, uri,
                TableCatalog.PROP_TABLE_TYPE, TableSummary.EXTERNAL_TABLE_TYPE, TableCatalog.PROP_EXTERNAL, "true",
                "version", read.get("version").asText());
    }

    @Override
    @SuppressWarnings("deprecation")  // Spark's relations still ask a table for it
    public StructType schema() {
        return (StructType) DataType.fromJson(read.get("view_schema").asText());
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ);
    }

    /** A scan that describes itself (DESCRIBE TABLE EXTENDED asks) but reads nothing: {@link Rules} replaces
     * every read of the table before Spark plans one, unless the session lacks the extension. */
    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        StructType schema = schema();
        return () -> new Scan() {
            @Override
            public StructType readSchema() {
                return schema;
            }

            @Override
            public Batch toBatch() {
                throw new UnsupportedOperationException("bitlake tables are read through bitlake's session "
                        + "extension: set spark.sql.extensions=" + Extension.class.getName() + " (docs/spark-sql.md)");
            }
        };
    }
}
