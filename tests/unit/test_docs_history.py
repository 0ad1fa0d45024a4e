"""The reference docs say what the software does today; what changed and when is in CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATED = re.compile(r"\b(before|since|until|as of)\s+(the\s+)?20\d\d-\d\d-\d\d", re.IGNORECASE)


def test_the_status_page_fits_one_screen_and_holds_no_date() -> None:
    text = (ROOT / "docs" / "status.md").read_text()
    assert len(text.splitlines()) <= 60 and len(text.encode()) <= 5_000, (len(text.splitlines()), len(text))
    assert not re.search(r"20\d\d-\d\d-\d\d", text), "a date in docs/status.md: history goes to CHANGELOG.md"


@pytest.mark.parametrize("page", ["relay.md", "sink.md", "source.md", "status.md"])
def test_a_reference_page_tells_no_history(page: str) -> None:
    found = [m.group(0) for m in DATED.finditer((ROOT / "docs" / page).read_text())]
    assert not found, f"docs/{page}: {found[:5]}: what changed and when goes to CHANGELOG.md"


def test_the_changelog_keeps_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and "keepachangelog.com" in text
