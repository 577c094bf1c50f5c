package io.bitlake.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.ExternalCommandRunner;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A bitlake SQL write when Spark runs it: the rows it takes (an INSERT's query, a MERGE's source) written as Parquet
 * to a folder of the table's staging area, then the planner's one commit, whose answer (the new version and the
 * counts) is the command's output.
 */
final class Commit implements ExternalCommandRunner {
    private final SparkSession session;
    private final BitlakeTable table;
    private final ObjectNode request;
    private final LogicalPlan rows;

    Commit(SparkSession session, BitlakeTable table, ObjectNode request, LogicalPlan rows) {
        this.session = session;
        this.table = table;
        this.request = request;
        this.rows = rows;
    }

    @Override
    public String[] executeCommand(String command, CaseInsensitiveStringMap options) {
        if (rows != null) {
            JsonNode staging = Planner.call(BitlakeTable.request("staging", table.uri, table.storage));
            stage(staging.get("uri").asText());
            request.put("staged", staging.get("rel").asText());
        }
        return new String[] {Planner.call(request).toString()};
    }

    /** The rows as Parquet at {@code uri}, timestamps as INT64 microseconds (Spark's default, INT96, has no zone
     * for pyarrow, which reads it as nanoseconds). */
    private void stage(String uri) {
        String key = "spark.sql.parquet.outputTimestampType";
        String before = session.conf().get(key);
        session.conf().set(key, "TIMESTAMP_MICROS");
        try {
            Dataset.ofRows(session, rows).write().parquet(uri);
        } finally {
            session.conf().set(key, before);
        }
    }
}
