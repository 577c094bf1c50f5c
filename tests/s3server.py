"""moto's S3 server on loopback, for the tests and benchmarks that run bitlake against a real S3 API."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.ports import free_port, wait_for_port

BUCKET = "bitlake-tests"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bitlake",
    "AWS_SECRET_ACCESS_KEY": "bitlake-secret",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


class S3Server:
    def __init__(self, process: subprocess.Popen, endpoint: str):
        self.process = process
        self.endpoint = endpoint
        # delta-rs's storage_options names (bitlake takes them, and so do deltalake and obstore)
        self.options = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}

    def uri(self, name: str = "t") -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:60]
        return f"s3://{BUCKET}/{safe}-{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_s3_server(export: bool = True) -> S3Server:
    """Starts the server, creates the bucket and (``export``) sets this process's AWS_* variables to it, which
    the processes it starts inherit."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, process, "moto's S3 server", timeout=30, interval=0.1)
    server = S3Server(process, endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    if export:
        os.environ.update(server.options)
    return server
