"""docs/server_args.md and docs/router_args.md match what radixlm/args_doc.py generates from the dataclasses."""
from __future__ import annotations

from radixlm.args_doc import PAGES, REGENERATE, ROOT, router_args_md, server_args_md, stale_pages
from radixlm.router.args import RouterArgs
from radixlm.runtime.args import ServerArgs


def test_generated_pages_are_current():
    stale = stale_pages()
    assert not stale, f"stale: {', '.join(stale)}; regenerate with `{REGENERATE}` and commit the result"


def test_every_field_and_section_is_on_its_page():
    import dataclasses

    server, router = server_args_md(), router_args_md()
    for f in dataclasses.fields(ServerArgs):
        assert f"`--{f.name.replace('_', '-')}`" in server
        assert f"## {f.metadata['section'].value}" in server
    for f in dataclasses.fields(RouterArgs):
        assert f"`--{f.name.replace('_', '-')}`" in router
    assert "`--disable-overlap-schedule`" in server and "`--enable-mixed-chunk`" in server
    assert "`--host`" in server  # radixlm serve's own flags
    assert set(PAGES) == {"docs/server_args.md", "docs/router_args.md"}
    assert (ROOT / "docs").is_dir()
