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
            Dataset.ofRows(session, rows).write().parquet(staging.get("uri").asText());
            request.put("staged", staging.get("rel").asText());
        }
        return new String[] {Planner.call(request).toString()};
    }
}
