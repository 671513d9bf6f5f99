"""A server whose snapshot limits are small enough to test past them."""

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer, make_settings


@pytest.fixture
def small_limits(database_url: str) -> Iterator[httpx.Client]:
    settings = make_settings(
        database_url,
        max_snapshot_bytes=2**20,
        max_snapshot_expanded_bytes=4 * 2**20,
    )
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as c:
        yield c
