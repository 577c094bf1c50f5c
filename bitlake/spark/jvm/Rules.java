package io.bitlake.spark;

import java.util.List;

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import scala.Function1;
import scala.runtime.AbstractPartialFunction;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The analyzer rule of bitlake's session extension: a SQL write whose target is a bitlake table becomes one
 * bitlake commit ({@link Writes}); every other relation of a bitlake table becomes Spark's own read of its files
 * ({@link Reads}).
 */
final class Rules extends Rule<LogicalPlan> {
    private final SparkSession session;

    Rules(SparkSession session) {
        this.session = session;
    }

    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        BitlakeTable written = Writes.target(plan);
        if (written != null) {
            return Writes.rewrite(session, plan, written);
        }
        return plan.resolveOperatorsUp(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan node) {
                return node instanceof DataSourceV2Relation r && Reads.isRead(r);
            }

            @Override
            public <A1 extends LogicalPlan, B1> B1 applyOrElse(A1 node, Function1<A1, B1> otherwise) {
                if (!isDefinedAt(node)) {
                    return otherwise.apply(node);
                }
                LogicalPlan replaced = Reads.plan(session, (DataSourceV2Relation) node);
                @SuppressWarnings("unchecked")
                B1 out = (B1) (replaced == null ? node : replaced);
                return out;
            }
        });
    }

    static <T> scala.collection.immutable.Seq<T> seq(List<T> items) {
        return CollectionConverters.asScala(items).toList();
    }
}
