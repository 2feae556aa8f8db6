"""`frozentune serve --allocator`: which allocator a process runs on, where a library is found, what
each choice means here, and (where tcmalloc is installed) a server started again with it preloaded."""
from __future__ import annotations

import sys

import pytest

from frozentune.serve import allocator
from frozentune.serve.allocator import AllocatorError, Plan, find, in_use, plan

LINUX = sys.platform.startswith("linux")


def test_in_use_reads_the_mapped_libraries(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f0-7f1 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert in_use(maps) == "system"
    maps.write_text("7f0-7f1 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
    assert in_use(maps) == "tcmalloc"
    maps.write_text("7f0-7f1 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert in_use(maps) == "jemalloc"
    assert in_use(tmp_path / "absent") == "system"  # not Linux: no /proc


def test_find_looks_in_the_given_folders(tmp_path):
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    assert find("jemalloc", (str(tmp_path),)) == str(tmp_path / "libjemalloc.so.2")
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find("tcmalloc", (str(tmp_path),)) == str(tmp_path / "libtcmalloc_minimal.so.4")  # the minimal one first


def nowhere(name: str) -> None:
    return None


def there(name: str) -> str:
    return f"/lib/{allocator.LIBRARIES[name][0]}"


@pytest.fixture
def fresh(monkeypatch):
    """A process not started again by --allocator, on Linux."""
    monkeypatch.delenv(allocator.MARK, raising=False)
    monkeypatch.setattr(allocator.sys, "platform", "linux")


def test_auto_preloads_tcmalloc_where_it_is_installed(fresh):
    p = plan("auto", can_restart=True, current="system", locate=there)
    assert p == Plan("tcmalloc", "/lib/libtcmalloc_minimal.so.4", p.note) and "preloaded" in p.note


def test_auto_without_tcmalloc_runs_on_the_system_malloc_and_says_how_to_get_it(fresh):
    p = plan("auto", can_restart=True, current="system", locate=nowhere)
    assert p.name == "system" and p.preload is None and "apt-get install libtcmalloc-minimal4" in p.note


def test_auto_inside_another_program_keeps_its_allocator(fresh):
    p = plan("auto", can_restart=False, current="system", locate=there)
    assert p.name == "system" and p.preload is None and "inside another program" in p.note


def test_an_allocator_already_preloaded_is_kept(fresh, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/lib/libjemalloc.so.2")
    assert plan("auto", True, current="jemalloc", locate=nowhere) == Plan("jemalloc", None, plan(
        "jemalloc", True, current="jemalloc", locate=nowhere).note)
    with pytest.raises(AllocatorError, match="already runs on jemalloc.*--allocator jemalloc"):
        plan("tcmalloc", True, current="jemalloc", locate=there)
    with pytest.raises(AllocatorError, match="without that LD_PRELOAD"):
        plan("system", True, current="jemalloc", locate=there)


def test_explicit_choices_that_cannot_be_had_are_errors_that_say_what_to_do(fresh):
    with pytest.raises(AllocatorError, match="libjemalloc.so.2 was not found.*apt-get install libjemalloc2"):
        plan("jemalloc", True, current="system", locate=nowhere)
    with pytest.raises(AllocatorError, match="inside another program; start that with LD_PRELOAD=/lib/libtcmalloc"):
        plan("tcmalloc", False, current="system", locate=there)
    with pytest.raises(AllocatorError, match="choose one of auto, system, tcmalloc, jemalloc"):
        plan("mimalloc", True, current="system", locate=there)
    assert plan("system", True, current="system", locate=there) == Plan("system", None, plan(
        "system", False, current="system", locate=there).note)


def test_a_preload_that_did_not_take_is_said_not_looped(fresh, monkeypatch):
    monkeypatch.setenv(allocator.MARK, "tcmalloc")
    with pytest.raises(AllocatorError, match="still not loaded"):
        plan("auto", True, current="system", locate=there)


def test_other_platforms_run_on_their_own_malloc(monkeypatch):
    monkeypatch.delenv(allocator.MARK, raising=False)
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert plan("auto", True, current="system", locate=there).name == "system"
    with pytest.raises(AllocatorError, match="Linux only"):
        plan("tcmalloc", True, current="system", locate=there)


def test_the_command_line_starts_again_before_torch_is_imported(fresh, monkeypatch):
    """main() on `frozentune serve ...` reads --allocator (either spelling, the last one wins) and starts
    again at once where a library is to be preloaded; what it cannot settle is left to cmd_serve."""
    from frozentune import cli

    started: list = []
    monkeypatch.setattr(allocator, "restart", lambda p, args: started.append((p.name, list(args))))
    monkeypatch.setattr(allocator, "find", there)
    monkeypatch.setattr(allocator, "in_use", lambda: "system")
    cli._allocator_before_imports(["serve", "m", "--allocator", "tcmalloc", "--allocator=jemalloc"])
    assert started == [("jemalloc", ["serve", "m", "--allocator", "tcmalloc", "--allocator=jemalloc"])]
    cli._allocator_before_imports(["serve", "m", "--allocator", "system"])
    cli._allocator_before_imports(["serve", "m", "--allocator", "mimalloc"])  # argparse says it
    monkeypatch.setattr(allocator, "find", nowhere)
    cli._allocator_before_imports(["serve", "m", "--allocator", "jemalloc"])  # cmd_serve says it
    assert len(started) == 1
