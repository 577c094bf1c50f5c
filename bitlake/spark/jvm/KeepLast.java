package io.bitlake.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.expressions.And;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ScalaUDF;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import scala.Function1;
import scala.runtime.AbstractPartialFunction;
import scala.jdk.javaapi.CollectionConverters;

/**
 * An optimizer rule: in a filter, the row filter {@code bitlake_keep} runs after the query's own conditions.
 * Spark merges a query's filter pushed down to a bitlake scan behind the row filter, and evaluates a filter's
 * conditions in order: a selective query would otherwise look up every row's id in the bitmaps, where it only
 * needs those of the rows its conditions keep.
 */
final class KeepLast extends Rule<LogicalPlan> {
    static final String NAME = "bitlake_keep";

    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        return plan.transform(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan node) {
                return node instanceof Filter f && reordered(f.condition()) != null;
            }

            @Override
            public <A1 extends LogicalPlan, B1> B1 applyOrElse(A1 node, Function1<A1, B1> otherwise) {
                if (!isDefinedAt(node)) {
                    return otherwise.apply(node);
                }
                Filter f = (Filter) node;
                @SuppressWarnings("unchecked")
                B1 out = (B1) new Filter(reordered(f.condition()), f.child());
                return out;
            }
        });
    }

    /** {@code condition} with its row-filter conjuncts last, or null when they are last already. */
    static Expression reordered(Expression condition) {
        List<Expression> conjuncts = new ArrayList<>();
        split(condition, conjuncts);
        List<Expression> others = new ArrayList<>();
        List<Expression> keeps = new ArrayList<>();
        for (Expression c : conjuncts) {
            (hasKeep(c) ? keeps : others).add(c);
        }
        if (keeps.isEmpty() || others.isEmpty() || keepsLast(conjuncts)) {
            return null;
        }
        others.addAll(keeps);
        Expression out = others.get(0);
        for (int i = 1; i < others.size(); i++) {
            out = new And(out, others.get(i));
        }
        return out;
    }

    private static boolean keepsLast(List<Expression> conjuncts) {
        boolean seenKeep = false;
        for (Expression c : conjuncts) {
            if (hasKeep(c)) {
                seenKeep = true;
            } else if (seenKeep) {
                return false;
            }
        }
        return true;
    }

    private static void split(Expression e, List<Expression> out) {
        if (e instanceof And and) {
            split(and.left(), out);
            split(and.right(), out);
        } else {
            out.add(e);
        }
    }

    static boolean hasKeep(Expression e) {
        if (e instanceof ScalaUDF u && u.udfName().isDefined() && NAME.equals(u.udfName().get())) {
            return true;
        }
        for (Expression child : CollectionConverters.asJava(e.children())) {
            if (hasKeep(child)) {
                return true;
            }
        }
        return false;
    }
}
