package io.bitlake.spark;

import java.util.HashSet;
import java.util.List;
import java.util.Set;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.analysis.EliminateSubqueryAliases;
import org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.Cast;
import org.apache.spark.sql.catalyst.expressions.ExprId;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.plans.logical.AppendData;
import org.apache.spark.sql.catalyst.plans.logical.Assignment;
import org.apache.spark.sql.catalyst.plans.logical.DeleteAction;
import org.apache.spark.sql.catalyst.plans.logical.DeleteFromTable;
import org.apache.spark.sql.catalyst.plans.logical.InsertAction;
import org.apache.spark.sql.catalyst.plans.logical.InsertIntoStatement;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.MergeAction;
import org.apache.spark.sql.catalyst.plans.logical.MergeIntoTable;
import org.apache.spark.sql.catalyst.plans.logical.UpdateAction;
import org.apache.spark.sql.catalyst.plans.logical.UpdateTable;
import org.apache.spark.sql.catalyst.plans.logical.V2WriteCommand;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.command.ExternalCommandExecutor;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import scala.Function1;
import scala.Option;
import scala.runtime.AbstractPartialFunction;
import scala.jdk.javaapi.CollectionConverters;

/**
 * SQL writes whose target is a bitlake table of the catalog, each one bitlake commit through the planner process
 * (bitlake's Python API), never Spark's row-level machinery: {@code INSERT INTO} ({@code Table.ingest} of the rows,
 * staged as Parquet), {@code DELETE FROM} ({@code Table.delete}), {@code UPDATE} ({@code Table.update}) and
 * {@code MERGE INTO} ({@code Table.merge}, the source staged as Parquet). Conditions and values go as the SQL
 * text of their resolved expressions, which bitlake's SQL compiler (sqlglot, Spark's dialect) takes; in a merge
 * the target's columns are {@code target.c} and the source's {@code source.c}. The statement becomes an
 * {@link ExternalCommandExecutor}, which runs once, when Spark executes the command.
 */
final class Writes {
    private Writes() {
    }

    /** The bitlake table a write command writes, or null. */
    static BitlakeTable target(LogicalPlan plan) {
        LogicalPlan table = plan instanceof DeleteFromTable d ? d.table()
                : plan instanceof UpdateTable u ? u.table()
                : plan instanceof MergeIntoTable m ? m.targetTable()
                : plan instanceof V2WriteCommand w ? (LogicalPlan) w.table()
                : plan instanceof InsertIntoStatement i ? i.table() : null;
        if (table == null) {
            return null;
        }
        LogicalPlan bare = EliminateSubqueryAliases.apply(table);
        return bare instanceof DataSourceV2Relation r && r.table() instanceof BitlakeTable b ? b : null;
    }

    /** {@code plan} as one bitlake commit, or as it is until Spark resolved it. */
    static LogicalPlan rewrite(SparkSession session, LogicalPlan plan, BitlakeTable table) {
        if (plan instanceof InsertIntoStatement || !plan.resolved()) {
            return plan;  // Spark turns an INSERT into an AppendData, and resolves the expressions, first
        }
        ObjectNode request;
        LogicalPlan staged = null;
        if (plan instanceof AppendData a) {
            request = BitlakeTable.request("insert", table.uri, table.storage);
            staged = a.query();
        } else if (plan instanceof V2WriteCommand) {
            throw new IllegalArgumentException("bitlake: a bitlake table takes INSERT INTO (an upsert of the rows); "
                    + "INSERT OVERWRITE would need a table-wide delete, which bitlake does not do implicitly");
        } else if (plan instanceof DeleteFromTable d) {
            request = BitlakeTable.request("delete", table.uri, table.storage);
            request.put("where", sql(d.condition(), null, "the DELETE condition"));
        } else if (plan instanceof UpdateTable u) {
            request = BitlakeTable.request("update", table.uri, table.storage);
            request.put("where", u.condition().isEmpty() ? null : sql(u.condition().get(), null,
                    "the UPDATE condition"));
            assignments(request.putObject("set"), u.assignments(), null);
        } else {
            MergeIntoTable m = (MergeIntoTable) plan;
            request = BitlakeTable.request("merge", table.uri, table.storage);
            Sides sides = new Sides(m.targetTable(), m.sourceTable());
            request.put("on", sql(m.mergeCondition(), sides, "the MERGE condition"));
            ArrayNode clauses = request.putArray("clauses");
            clauses(clauses, "matched", m.matchedActions(), sides);
            clauses(clauses, "not_matched", m.notMatchedActions(), sides);
            clauses(clauses, "not_matched_by_source", m.notMatchedBySourceActions(), sides);
            staged = m.sourceTable();
        }
        return new ExternalCommandExecutor(new Commit(session, table, request, staged), request.get("op").asText(),
                scala.collection.immutable.Map$.MODULE$.empty());
    }

    private static void clauses(ArrayNode out, String when, scala.collection.immutable.Seq<MergeAction> actions,
                                Sides sides) {
        for (MergeAction action : CollectionConverters.asJava(actions)) {
            ObjectNode clause = out.addObject().put("when", when);
            Option<Expression> condition = action.condition();
            clause.put("condition", condition.isEmpty() ? null : sql(condition.get(), sides,
                    "a WHEN condition of the MERGE"));
            if (action instanceof DeleteAction) {
                clause.put("action", "delete");
            } else if (action instanceof UpdateAction u && u.fromStar()) {
                clause.put("action", "update_all");  // every column but the key, which the match keeps
            } else if (action instanceof UpdateAction u) {
                clause.put("action", "update");
                assignments(clause.putObject("set"), u.assignments(), sides);
            } else if (action instanceof InsertAction i) {
                clause.put("action", "insert");
                assignments(clause.putObject("set"), i.assignments(), sides);
            } else {
                throw new IllegalArgumentException("bitlake: the MERGE action " + action.sql() + " has no bitlake "
                        + "equivalent");
            }
        }
    }

    private static void assignments(ObjectNode out, scala.collection.immutable.Seq<Assignment> assignments,
                                    Sides sides) {
        for (Assignment a : CollectionConverters.asJava(assignments)) {
            if (!(a.key() instanceof AttributeReference key)) {
                throw new IllegalArgumentException("bitlake: SET " + a.key().sql() + ": only a column of the table "
                        + "can be set");
            }
            if (a.value() instanceof AttributeReference v && v.exprId().equals(key.exprId())) {
                continue;  // SET c = c, as Spark spells the columns an UPDATE leaves as they are
            }
            out.put(key.name(), sql(a.value(), sides, "the value of " + key.name()));
        }
    }

    /** The target's and the source's attributes of a merge, by expression id. */
    private record Sides(Set<ExprId> target, Set<ExprId> source) {
        Sides(LogicalPlan target, LogicalPlan source) {
            this(ids(target), ids(source));
        }

        private static Set<ExprId> ids(LogicalPlan plan) {
            Set<ExprId> out = new HashSet<>();
            CollectionConverters.asJava(plan.output()).forEach(a -> out.add(a.exprId()));
            return out;
        }
    }

    /** {@code e} without the casts Spark's analyzer added (those of a {@code CAST} the statement wrote stay): bitlake's
     * compiler types the SQL as Spark does, and a merge matches rows by equal columns, not by a cast of one. */
    static Expression withoutImplicitCasts(Expression e) {
        return e.transformUp(new AbstractPartialFunction<Expression, Expression>() {
            @Override
            public boolean isDefinedAt(Expression x) {
                return x instanceof Cast c && c.getTagValue(Cast.USER_SPECIFIED_CAST()).isEmpty();
            }

            @Override
            public <A1 extends Expression, B1> B1 applyOrElse(A1 x, Function1<A1, B1> otherwise) {
                if (!isDefinedAt(x)) {
                    return otherwise.apply(x);
                }
                @SuppressWarnings("unchecked")
                B1 out = (B1) ((Cast) x).child();
                return out;
            }
        });
    }

    /** {@code e} as SQL text bitlake's compiler takes: as the statement wrote it (without the analyzer's casts),
     * columns by name (in a merge, {@code target.c} or {@code source.c}); an expression with a subquery is refused,
     * naming it. */
    static String sql(Expression e, Sides sides, String what) {
        if (SubqueryExpression.hasSubquery(e)) {
            throw new IllegalArgumentException("bitlake: " + what + " (" + e.sql() + ") has a subquery, which a "
                    + "bitlake write cannot evaluate: give the values, or MERGE with the subquery as the source");
        }
        Expression named = withoutImplicitCasts(e).transform(new AbstractPartialFunction<Expression, Expression>() {
            @Override
            public boolean isDefinedAt(Expression x) {
                return x instanceof AttributeReference;
            }

            @Override
            public <A1 extends Expression, B1> B1 applyOrElse(A1 x, Function1<A1, B1> otherwise) {
                if (!(x instanceof AttributeReference a)) {
                    return otherwise.apply(x);
                }
                List<String> parts = sides == null ? List.of(a.name())
                        : sides.target().contains(a.exprId()) ? List.of("target", a.name())
                        : sides.source().contains(a.exprId()) ? List.of("source", a.name()) : List.of(a.name());
                @SuppressWarnings("unchecked")
                B1 out = (B1) new UnresolvedAttribute(Rules.seq(parts));
                return out;
            }
        });
        return named.sql();
    }
}
