"""docs/sdk.md must stay runnable: its ```python blocks are executed in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def test_sdk_doc_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "sdk_doc"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
    finally:
        for name in ("computation_server", "decryption_server"):
            server = namespace.get(name)
            if server is not None:
                server.stop()  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "refused: RESOURCE_EXHAUSTED" not in out  # details are printed without the code prefix
    assert out.count("committed") == 3 and "refused:" in out and "spent 0.8 of 1.0, 0.2 left" in out
    assert "charged 0.1000019 (the plain sum would be 0.3)" in out
    assert "signed by clinic-a, clinic-b, clinic-c" in out  # every owner's signature verified in the release
