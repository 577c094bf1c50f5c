"""Spark servers started from the pyspark package for the tests: a Spark Connect server, and a standalone
cluster (a master and workers). Each runs on loopback with the project's interpreter for Python workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

from tests.ports import free_port, wait_for_port

SPARK_HOME = str(Path(pyspark.__file__).parent)


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"SPARK_HOME": SPARK_HOME, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"})
    env.update(extra or {})
    return env


def _wait_port(port: int, process: subprocess.Popen, log: Path, what: str) -> None:
    wait_for_port(port, process, what, output=lambda: log.read_text(errors="replace")[-4000:])


class Server:
    def __init__(self, processes: list[subprocess.Popen], url: str):
        self.processes = processes
        self.url = url

    def stop(self) -> None:
        """Stops each process's group: the start scripts run the JVM as their child, which a signal to the
        script alone left running after the tests."""
        for p in reversed(self.processes):
            _signal_group(p, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # started with start_new_session: its own group
    except ProcessLookupError:
        pass


def start_connect_server(folder: Path, master: str = "local[2]") -> Server:
    """``start-connect-server.sh`` in the foreground, with bitlake's jar, session extension and catalog (the
    settings ``bitlake.spark_session`` gives its sessions, docs/spark-sql.md); ``url`` is its ``sc://`` address."""
    from bitlake.spark.session import sql_conf

    port = free_port()
    log = folder / "connect.log"
    command = ["bash", f"{SPARK_HOME}/sbin/start-connect-server.sh", "--master", master,
               "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.sql.session.timeZone=UTC",
               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
               "--conf", "spark.driver.memory=1g"]
    for key, value in sql_conf().items():
        command += ["--conf", f"{key}={value}"]
    with open(log, "wb") as out:
        p = subprocess.Popen(command, env=_env({"SPARK_LOG_DIR": str(folder), "SPARK_PID_DIR": str(folder)}),
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_port(port, p, log, "the Spark Connect server")
    return Server([p], f"sc://127.0.0.1:{port}")


def start_cluster(folder: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Server:
    """A standalone master and ``workers`` workers (``spark-class``); ``url`` is the ``spark://`` master. The
    workers' environment has no ``AWS_*`` variables: what executors know of a store comes with the table."""
    port, ui = free_port(), free_port()
    processes = []
    spark_class = f"{SPARK_HOME}/bin/spark-class"
    log = folder / "master.log"
    with open(log, "wb") as out:
        processes.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)], env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    _wait_port(port, processes[0], log, "the Spark master")
    url = f"spark://127.0.0.1:{port}"
    for i in range(workers):
        work = folder / f"worker-{i}"
        work.mkdir()
        with open(folder / f"worker-{i}.log", "wb") as out:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(work), "--webui-port", str(free_port()), url],
                env={k: v for k, v in _env().items() if not k.startswith("AWS_")}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    server = Server(processes, url)
    try:
        _wait_workers(ui, workers, folder)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_workers(ui: int, workers: int, folder: Path, timeout: float = 120) -> None:
    """Until the master lists ``workers`` alive workers (its web UI's JSON), so a session started next gets
    an executor on each."""
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
                alive = json.load(response).get("aliveworkers", 0)
        except OSError:
            alive = 0
        if alive >= workers:
            return
        time.sleep(0.5)
    logs = "\n".join(f"{log.name}: {log.read_text(errors='replace')[-1500:]}" for log in sorted(folder.glob("*.log")))
    raise RuntimeError(f"{alive} of {workers} Spark workers registered within {timeout:.0f} s\n{logs}")


def wait_executors(spark, wanted: int, timeout: float = 120) -> int:
    """How many executors have registered with ``spark``'s driver, once ``wanted`` have or ``timeout`` seconds have
    passed: executors register a moment after the session starts."""
    deadline = time.monotonic() + timeout
    while True:
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver is listed too
        if executors >= wanted or time.monotonic() > deadline:
            return executors
        time.sleep(0.5)
