"""The storage contract: every guarantee of ``bitlake/fs.py``'s docstring, checked for each implementation.

The ``fileio`` fixture runs every test once per implementation in :data:`IMPLEMENTATIONS`. Adding one (an
object store, say) is one more entry there: a factory that returns a fresh, empty :class:`FileIO` for one
test (it may use ``request.addfinalizer`` to clean up) and, if it needs a server, a marker.
``test_every_implementation_is_under_contract`` fails until a new implementation class is listed.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bitlake import fs
from bitlake.errors import InvalidInputError
from bitlake.fs import FileIO, LocalFileIO, file_io
from bitlake.fs.objectstore import ObjectStoreFileIO

TMP_PREFIX = ".tmp-"


def _local(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    # A base folder that does not exist yet: the implementation creates what it needs.
    return LocalFileIO(str(tmp_path / "table"))


def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    server = request.getfixturevalue("s3_server")  # moto's S3 API on loopback, started once a session
    return file_io(server.uri(request.node.name))


def _azure(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    from tests.emulators import azurite

    server = azurite()  # Azurite on loopback, started once a test process
    return file_io(server.uri(request.node.name), server.options)


def _gcs(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    from tests.emulators import gcs

    server = gcs()  # fake-gcs-server on loopback, started once a test process
    return file_io(server.uri(request.node.name), server.options)


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    return file_io(f"memory:///{tmp_path.name}/table")


# (factory, the FileIO classes it covers) per implementation under contract; the pytest id is the key.
IMPLEMENTATIONS: dict[str, tuple[Callable[[pytest.FixtureRequest, Path], FileIO], tuple[type, ...]]] = {
    "local": (_local, (LocalFileIO,)),
    "s3": (_s3, (ObjectStoreFileIO,)),
    "azure": (_azure, (ObjectStoreFileIO,)),
    "gcs": (_gcs, (ObjectStoreFileIO,)),
    "memory": (_memory, (ObjectStoreFileIO,)),
}
MARKS: dict[str, list[pytest.MarkDecorator]] = {"s3": [pytest.mark.s3], "azure": [pytest.mark.azure],
                                                "gcs": [pytest.mark.gcs]}


@pytest.fixture(params=[pytest.param(name, id=name, marks=MARKS.get(name, ())) for name in IMPLEMENTATIONS])
def fileio(request: pytest.FixtureRequest, tmp_path: Path) -> FileIO:
    factory, _ = IMPLEMENTATIONS[request.param]
    return factory(request, tmp_path)


def _payload(writer: int, size: int = 64 * 1024) -> bytes:
    """Bytes that tell which writer wrote them, large enough that writes take a moment."""
    head = f"writer {writer}\n".encode()
    return head + bytes([writer % 251]) * (size - len(head))


def _no_tmp_files(fileio: FileIO) -> None:
    leftovers = [p for p in fileio.walk() if p.rsplit("/", 1)[-1].startswith(TMP_PREFIX)]
    assert leftovers == []


def _utf8_sorted(names):
    return sorted(names, key=lambda n: n.encode("utf-8"))


# --- the registry ---------------------------------------------------------------------------------------


def test_every_implementation_is_under_contract():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    implemented = {c for c in subclasses(FileIO) if c.__module__.startswith("bitlake")}
    covered = {c for _, classes in IMPLEMENTATIONS.values() for c in classes}
    assert implemented <= covered, f"add a contract fixture for {sorted(c.__name__ for c in implemented - covered)}"


# --- put_if_absent --------------------------------------------------------------------------------------


def test_put_if_absent_creates_the_file_with_exactly_the_bytes(fileio):
    data = bytes(range(256)) * 3
    fileio.put_if_absent("log/00000000000000000001.json", data)
    assert fileio.exists("log/00000000000000000001.json")
    assert fileio.read_bytes("log/00000000000000000001.json") == data
    assert fileio.size("log/00000000000000000001.json") == len(data)
    fileio.put_if_absent("empty", b"")
    assert fileio.read_bytes("empty") == b""
    _no_tmp_files(fileio)


def test_put_if_absent_creates_nested_folders(fileio):
    fileio.put_if_absent("a/b/c/d.bin", b"deep")
    assert fileio.read_bytes("a/b/c/d.bin") == b"deep"
    assert fileio.walk() == ["a/b/c/d.bin"]


def test_second_put_if_absent_fails_and_keeps_the_first_content(fileio):
    fileio.put_if_absent("claim", b"first")
    with pytest.raises(FileExistsError):
        fileio.put_if_absent("claim", b"second, longer content")
    assert fileio.read_bytes("claim") == b"first"
    # Also over a file written another way.
    fileio.write_atomic("other", b"atomic")
    with pytest.raises(FileExistsError):
        fileio.put_if_absent("other", b"x")
    assert fileio.read_bytes("other") == b"atomic"
    assert fileio.listdir("") == ["claim", "other"]


def _check_race(fileio: FileIO, name: str, outcomes: dict[int, str], payload_size: int) -> None:
    """Exactly one writer won, the file holds its bytes, every other one got FileExistsError."""
    winners = [w for w, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1, (name, outcomes)
    losers = {w: outcome for w, outcome in outcomes.items() if w != winners[0]}
    assert set(losers.values()) <= {"FileExistsError"}, (name, losers)
    assert fileio.read_bytes(name) == _payload(winners[0], payload_size)


def test_put_if_absent_race_of_threads(fileio):
    writers, rounds, size = 12, 8, 256 * 1024
    barrier = threading.Barrier(writers)
    outcomes: dict[str, dict[int, str]] = {f"race/{r}.json": {} for r in range(rounds)}

    def run(writer: int) -> None:
        for name, results in outcomes.items():
            barrier.wait(timeout=30)
            try:
                fileio.put_if_absent(name, _payload(writer, size))
                results[writer] = "won"
            except Exception as e:  # noqa: BLE001 - any other error is a contract failure, recorded
                results[writer] = type(e).__name__

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    for name, results in outcomes.items():
        assert len(results) == writers
        _check_race(fileio, name, results, size)
    assert fileio.listdir("race") == _utf8_sorted(f"{r}.json" for r in range(rounds))
    _no_tmp_files(fileio)


def _put_in_process(fileio, writer, names, size, barrier, queue):
    """Runs in a spawned process: races ``put_if_absent`` on each name, reports every outcome."""
    for name in names:
        barrier.wait(timeout=30)
        try:
            fileio.put_if_absent(name, _payload(writer, size))
            queue.put((writer, name, "won"))
        except Exception as e:  # noqa: BLE001
            queue.put((writer, name, type(e).__name__))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_put_if_absent_race_of_processes(fileio):
    if fileio.process_local:
        pytest.skip("a memory:// store lives in one process")
    ctx = multiprocessing.get_context("spawn")
    writers, size = 3, 256 * 1024
    names = [f"claims/part-{r}" for r in range(6)]
    barrier, queue = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_put_in_process, args=(fileio, w, names, size, barrier, queue)) for w in range(writers)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=30) for _ in range(writers * len(names))]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * writers
    for name in names:
        _check_race(fileio, name, {w: outcome for w, n, outcome in reports if n == name}, size)
    assert fileio.listdir("claims") == _utf8_sorted(n.split("/")[1] for n in names)
    _no_tmp_files(fileio)


# --- write_atomic ---------------------------------------------------------------------------------------


def test_write_atomic_replaces_the_content_completely(fileio):
    fileio.write_atomic("state/current.json", b"a much longer first version of the file")
    assert fileio.read_bytes("state/current.json") == b"a much longer first version of the file"
    fileio.write_atomic("state/current.json", b"short")
    assert fileio.read_bytes("state/current.json") == b"short"
    assert fileio.size("state/current.json") == 5
    fileio.write_atomic("state/current.json", b"")
    assert fileio.read_bytes("state/current.json") == b""
    assert fileio.listdir("state") == ["current.json"]
    _no_tmp_files(fileio)


def test_write_atomic_readers_never_see_a_mix(fileio):
    size, writes = 512 * 1024, 60
    versions = [_payload(v, size) for v in range(writes)]
    fileio.write_atomic("hot", versions[0])
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for v in versions[1:]:
                fileio.write_atomic("hot", v)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                data = fileio.read_bytes("hot")
                writer = int(data.split(b"\n", 1)[0].split()[1])
                assert data == versions[writer], f"a mixed or torn read ({len(data)} bytes)"
                seen.append(writer)
        except BaseException as e:  # noqa: BLE001 - reported in the test's thread
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    write()
    for t in readers:
        t.join(timeout=60)
    assert errors == []
    assert seen, "the readers never ran"
    assert fileio.read_bytes("hot") == versions[-1]
    _no_tmp_files(fileio)


# --- open_output / open_input ---------------------------------------------------------------------------


def test_parquet_round_trip_through_open_output_and_open_input(fileio):
    table = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "name": [f"name-{i}-é" for i in range(1000)],
            "value": pa.array([i / 7 for i in range(1000)], pa.float64()),
        }
    )
    rel = "data/ds=2024-01-01/part-00000.parquet"
    with fileio.open_output(rel) as out:
        pq.write_table(table, out)
        written = out.tell()
    assert fileio.size(rel) == written > 0
    with fileio.open_input(rel) as f:
        assert pq.read_table(f).equals(table)
    assert fileio.read_bytes(rel)[:4] == b"PAR1"


def test_open_output_size_equals_the_bytes_written_and_creates_folders(fileio):
    chunks = [b"x" * 1000, b"", bytes(range(256)) * 10]
    with fileio.open_output("a/b/c/blob.bin") as out:
        for chunk in chunks:
            out.write(chunk)
    assert fileio.size("a/b/c/blob.bin") == sum(map(len, chunks))
    assert fileio.read_bytes("a/b/c/blob.bin") == b"".join(chunks)
    with fileio.open_input("a/b/c/blob.bin") as f:  # random access
        assert f.size() == sum(map(len, chunks))
        f.seek(1000)
        assert f.read(3) == bytes([0, 1, 2])
    assert fileio.listdir("a") == ["b"]
    assert fileio.listdir("a/b/c") == ["blob.bin"]


# --- list / walk ----------------------------------------------------------------------------------------


NAMES = ["a", "B", "b-1", "é", "10", "9", "Z", "_x", "a.b", "ab"]


def test_list_is_sorted_by_utf8_bytes(fileio):
    for name in NAMES:
        fileio.put_if_absent(f"dir/{name}", name.encode())
    listed = fileio.listdir("dir")
    assert listed == ["10", "9", "B", "Z", "_x", "a", "a.b", "ab", "b-1", "é"]
    assert listed == _utf8_sorted(NAMES)
    assert fileio.listdir("dir/") == listed


def test_list_gives_the_names_directly_under_a_folder(fileio):
    for rel in ["t/x.json", "t/sub/y.json", "t/sub/deeper/z.json", "t2/w", "top"]:
        fileio.write_atomic(rel, b"1")
    assert fileio.listdir("t") == ["sub", "x.json"]
    assert fileio.listdir("t/sub") == ["deeper", "y.json"]
    assert fileio.listdir("") == ["t", "t2", "top"]


def test_list_of_a_missing_folder_is_empty(fileio):
    assert fileio.listdir("nothing") == []
    assert fileio.listdir("nothing/below/here") == []
    fileio.write_atomic("some/file", b"1")
    assert fileio.listdir("some/other") == []


def test_walk_gives_every_file_below_sorted(fileio):
    files = ["é/1", "10/z", "9", "B", "a/x", "a-b", "a.c", "a/b/c/d", "b-1/é/2"]
    for rel in files:
        fileio.write_atomic(rel, rel.encode())
    walked = fileio.walk()
    assert walked == _utf8_sorted(files)
    assert walked[:4] == ["10/z", "9", "B", "a-b"]
    # Below a folder: the same relative-to-base paths, only that folder's.
    assert fileio.walk("a") == ["a/b/c/d", "a/x"]
    assert fileio.walk("b-1") == ["b-1/é/2"]
    assert all("\\" not in p and not p.startswith("/") for p in walked)
    for rel in walked:
        assert fileio.read_bytes(rel) == rel.encode()


def test_walk_of_a_missing_folder_is_empty(fileio):
    assert fileio.walk() == []
    assert fileio.walk("missing") == []


# --- missing files, delete, exists ----------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["missing.json", "missing/folder/file.json"])
def test_reading_a_missing_file_raises_file_not_found(fileio, rel):
    fileio.write_atomic("present", b"1")
    with pytest.raises(FileNotFoundError):
        fileio.read_bytes(rel)
    with pytest.raises(FileNotFoundError):
        fileio.size(rel)
    with pytest.raises(FileNotFoundError):
        fileio.open_input(rel)


def test_delete(fileio):
    fileio.put_if_absent("d/gone", b"1")
    fileio.put_if_absent("d/kept", b"2")
    fileio.delete("d/gone")
    assert not fileio.exists("d/gone")
    assert fileio.listdir("d") == ["kept"]
    with pytest.raises(FileNotFoundError):
        fileio.read_bytes("d/gone")
    # Deleting a missing file (again, or never written, or in a missing folder) does nothing.
    fileio.delete("d/gone")
    fileio.delete("never")
    fileio.delete("no/such/folder/file")
    assert fileio.read_bytes("d/kept") == b"2"
    # The name can be claimed again once deleted.
    fileio.put_if_absent("d/gone", b"3")
    assert fileio.read_bytes("d/gone") == b"3"


def test_exists(fileio):
    assert not fileio.exists("f")
    fileio.put_if_absent("f", b"")
    assert fileio.exists("f")
    fileio.write_atomic("x/y/z", b"1")
    assert fileio.exists("x/y/z")
    assert not fileio.exists("x/y/other")
    fileio.delete("f")
    assert not fileio.exists("f")


def test_mtime(fileio):
    before = time.time()
    fileio.put_if_absent("m", b"1")
    # Loose: an object store's clock is not this machine's.
    assert abs(fileio.mtime("m") - before) < 60
    with pytest.raises(FileNotFoundError):
        fileio.mtime("missing")


def test_remove_empty_dirs_keeps_files(fileio):
    for rel in ["r/a/b/c/1", "r/a/x/2", "r/keep/3"]:
        fileio.write_atomic(rel, b"1")
    fileio.delete("r/a/b/c/1")
    fileio.delete("r/a/x/2")
    fileio.remove_empty_dirs("r")
    assert fileio.walk() == ["r/keep/3"]
    assert fileio.listdir("r") == ["keep"]
    fileio.remove_empty_dirs("missing")


def test_uri_and_local_path_address_the_file(fileio):
    fileio.put_if_absent("sub/f.bin", b"abc")
    assert fileio.uri("sub/f.bin").startswith(fileio.uri().rstrip("/") + "/")
    assert fileio.uri("sub/f.bin").endswith("sub/f.bin")
    local = fileio.local_path("sub/f.bin")
    if local is not None:
        assert Path(local).read_bytes() == b"abc"


# --- values: pickling, equality, the factory ------------------------------------------------------------


def test_fileio_pickles_and_compares_equal(fileio):
    fileio.put_if_absent("p", b"pickled")
    copy = pickle.loads(pickle.dumps(fileio))
    assert copy == fileio
    assert hash(copy) == hash(fileio)
    assert copy.read_bytes("p") == b"pickled"
    assert copy.uri() == fileio.uri()


def test_file_io_of_the_uri_names_the_same_base(fileio):
    assert file_io(fileio.uri()) == fileio
    assert file_io(fileio) is fileio


def test_fileios_of_different_bases_differ(tmp_path):
    assert LocalFileIO(str(tmp_path / "a")) != LocalFileIO(str(tmp_path / "b"))
    assert LocalFileIO(str(tmp_path / "a")) == LocalFileIO(str(tmp_path / "x" / ".." / "a"))


def test_file_uri_and_local_path_give_equal_objects():
    assert file_io("file:///x/y") == file_io("/x/y")
    assert isinstance(file_io("file:///x/y"), LocalFileIO)
    assert file_io("file:///x/y%20z") == file_io("/x/y z")
    assert file_io("file:///x/y").local_path("a/b") == "/x/y/a/b"
    assert file_io("/x/y").uri("a") == "file:///x/y/a"


@pytest.mark.parametrize("scheme", ["hdfs", "ftp"])
def test_unknown_scheme_is_refused_naming_it(scheme):
    assert scheme not in fs._IMPLEMENTATIONS
    with pytest.raises(InvalidInputError, match=f"unsupported storage scheme '{scheme}'"):
        file_io(f"{scheme}://bucket/tables/t")


def test_file_uris_with_one_slash_are_local_and_with_a_host_are_refused():
    assert file_io("file:/x/y") == file_io("/x/y")
    with pytest.raises(InvalidInputError, match="names the host 'x'"):
        file_io("file://x/y")
