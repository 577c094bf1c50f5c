"""The memory a process may use (bitlake.memory.usable_bytes): the machine's, or its control group's limit when
lower, read from a cgroup tree laid out as the kernel lays it out."""

from __future__ import annotations

import subprocess
import sys

from bitlake import memory


def _tree(tmp_path, files: dict[str, str], cgroup: str):
    for rel, text in files.items():
        p = tmp_path / "fs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
    (tmp_path / "cgroup").write_text(cgroup)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


def test_v2_limit_of_the_group_or_a_group_above(tmp_path):
    root, cg = _tree(tmp_path, {"kubepods/pod1/memory.max": "max", "kubepods/memory.max": str(3 << 30),
                                "memory.max": "max"}, "0::/kubepods/pod1\n")
    assert memory.usable_bytes(root, cg) == 3 << 30


def test_v1_limit_and_no_limit(tmp_path):
    root, cg = _tree(tmp_path, {"memory/docker/abc/memory.limit_in_bytes": str(2 << 30),
                                "memory/memory.limit_in_bytes": "9223372036854771712"},
                     "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert memory.usable_bytes(root, cg) == 2 << 30
    root, cg = _tree(tmp_path / "none", {"memory/memory.limit_in_bytes": "9223372036854771712"}, "4:memory:/\n")
    assert memory.usable_bytes(root, cg) == memory._physical_bytes()


def test_a_limit_above_the_machine_is_the_machine(tmp_path):
    root, cg = _tree(tmp_path, {"memory.max": str(1 << 61)}, "0::/\n")
    assert memory.usable_bytes(root, cg) == memory._physical_bytes()
    assert memory.usable_bytes(root, str(tmp_path / "missing")) == memory._physical_bytes()


def test_a_cache_budget_that_is_no_number_is_refused_by_name():
    run = subprocess.run([sys.executable, "-c", "import bitlake.engine.keys.keycache"], capture_output=True,
                         text=True, env={"BITLAKE_KEYSTORE_CACHE_BYTES": "2GB", "PATH": ""})
    assert run.returncode != 0
    assert "BITLAKE_KEYSTORE_CACHE_BYTES must be a number of bytes" in run.stderr
