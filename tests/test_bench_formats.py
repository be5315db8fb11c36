"""The wire formats benchmark runs end to end on a small load (its figures are bench's)."""

from __future__ import annotations

import json

from bench import formats


def test_every_format_gets_a_cpu_figure_beside_the_envelope(tmp_path):
    formats.main(["--rounds", "1", "--messages", "100", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "formats.json").read_text())
    assert set(result["http"]) == {name for name, *_ in formats.HTTP_VARIANTS}
    assert set(result["kafka"]) == {name for name, *_ in formats.VARIANTS}
    for transport in ("http", "kafka"):
        assert result[transport]["envelope"]["ratio_to_envelope"] == 1.0
        assert all(f["cpu_us_per_message"] > 0 for f in result[transport].values())
    assert "| kafka | cloudevents-binary |" in (tmp_path / "formats.md").read_text()
