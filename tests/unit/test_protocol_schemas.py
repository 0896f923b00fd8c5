"""schemas/protocol/*.schema.json are generated from schemas/protocol.py and must not drift."""
from __future__ import annotations

from schemas.generate import PROTOCOL_DIR, protocol_schemas, render


def test_checked_in_protocol_schemas_equal_the_generated_ones():
    generated = protocol_schemas()
    on_disk = {p.name for p in PROTOCOL_DIR.glob("*.schema.json")}
    assert on_disk == set(generated), "run `python -m schemas.generate`"
    for name, schema in generated.items():
        assert (PROTOCOL_DIR / name).read_text() == render(schema), f"{name} drifted: python -m schemas.generate"
