package io.bitlake.spark;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.SparkEnv;

/**
 * The driver's link to bitlake's Python planner ({@code python -m bitlake.cli.planner}): one long-lived process
 * a JVM, asked one JSON line and answering one, so that reads are planned and writes committed by bitlake's one
 * Python implementation. The interpreter is the conf {@code spark.bitlake.python} (bitlake.spark_session sets it to
 * its own), else {@code $PYSPARK_PYTHON}, else {@code python3}.
 */
public final class Planner {
    static final ObjectMapper JSON = new ObjectMapper();
    private static Process process;
    private static BufferedWriter requests;
    private static BufferedReader answers;

    private Planner() {
    }

    static ObjectNode request(String op) {
        return JSON.createObjectNode().put("op", op);
    }

    /** The answer's {@code ok} value; a planner error is raised here with its message. */
    static synchronized JsonNode call(ObjectNode request) {
        String line;
        try {
            line = exchange(request.toString());
        } catch (IOException e) {
            stop();
            try {
                line = exchange(request.toString());  // the process died (or was never started): once more
            } catch (IOException again) {
                stop();
                throw new IllegalStateException("bitlake: the planner process (" + python()
                        + " -m bitlake.cli.planner) failed: " + again.getMessage(), again);
            }
        }
        JsonNode answer;
        try {
            answer = JSON.readTree(line);
        } catch (IOException e) {
            throw new IllegalStateException("bitlake: the planner answered " + line, e);
        }
        if (answer.has("error")) {
            throw new IllegalArgumentException("bitlake: " + answer.get("kind").asText() + ": "
                    + answer.get("error").asText());
        }
        return answer.get("ok");
    }

    private static String exchange(String request) throws IOException {
        if (process == null || !process.isAlive()) {
            start();
        }
        requests.write(request);
        requests.write('\n');
        requests.flush();
        String line = answers.readLine();
        if (line == null) {
            throw new IOException("the planner process ended (exit " + waitFor() + "); its errors are on stderr");
        }
        return line;
    }

    private static int waitFor() {
        try {
            return process.waitFor();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return -1;
        }
    }

    private static void start() throws IOException {
        ProcessBuilder builder = new ProcessBuilder(List.of(python(), "-m", "bitlake.cli.planner"));
        builder.redirectError(ProcessBuilder.Redirect.INHERIT);
        process = builder.start();
        requests = new BufferedWriter(new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
        answers = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    }

    private static void stop() {
        if (process != null) {
            process.destroy();
            process = null;
        }
    }

    static String python() {
        SparkEnv env = SparkEnv.get();
        String conf = env == null ? null : env.conf().get("spark.bitlake.python", null);
        if (conf != null && !conf.isEmpty()) {
            return conf;
        }
        String fromEnv = System.getenv("PYSPARK_PYTHON");
        return fromEnv != null && !fromEnv.isEmpty() ? fromEnv : "python3";
    }
}
