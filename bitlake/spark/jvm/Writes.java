package io.bitlake.spark;

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.SparkSession;

/** SQL writes into bitlake tables, each one bitlake commit. */
final class Writes {
    private Writes() {
    }

    static boolean targetsBitlake(LogicalPlan plan) {
        return false;
    }

    static LogicalPlan rewrite(SparkSession session, LogicalPlan plan) {
        return plan;
    }
}
