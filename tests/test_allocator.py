"""`lethe serve`'s allocator settings (app/allocator.py): added once, others kept."""

from __future__ import annotations

from app.allocator import NO_THREAD_CACHE, children_environment, scrubbing_environment


def test_the_settings_are_added_to_what_is_there_and_only_once() -> None:
    first = scrubbing_environment({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert first is not None
    assert first["PATH"] == "/bin" and first["PYTHONMALLOC"] == "malloc"
    assert first["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{NO_THREAD_CACHE}"
    assert scrubbing_environment(first) is None  # the restarted process does not restart
    assert scrubbing_environment({})["GLIBC_TUNABLES"] == NO_THREAD_CACHE  # type: ignore[index]
    # PYTHONMALLOC set otherwise (pymalloc's debug hooks, say) is replaced
    assert scrubbing_environment({**first, "PYTHONMALLOC": "pymalloc"}) is not None


def test_the_children_get_the_environment_as_it_was() -> None:
    before = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    restarted = scrubbing_environment(before)
    assert restarted is not None
    assert children_environment(restarted) == before
    assert children_environment({"PATH": "/bin"}) == {"PATH": "/bin"}
