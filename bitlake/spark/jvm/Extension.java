package io.bitlake.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * bitlake's Spark session extension ({@code spark.sql.extensions=io.bitlake.spark.Extension}): the analyzer rule
 * {@link Rules}, which turns reads of bitlake tables into Spark's own scans of their files and SQL writes into
 * bitlake commits, and the optimizer rule {@link KeepLast}, which runs the row filter after a query's conditions.
 */
public final class Extension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectResolutionRule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new Rules((org.apache.spark.sql.classic.SparkSession) session);
            }
        });
        extensions.injectOptimizerRule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new KeepLast();
            }
        });
        return BoxedUnit.UNIT;
    }
}
