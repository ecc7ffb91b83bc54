"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """A loopback Hub server (tests/hub_server.py) for the whole session; stopped at the end of it.

    Point a subprocess at it with `hub_server.env()` (HF_ENDPOINT, HF_HUB_OFFLINE=0, HF_HUB_DISABLE_XET=1).
    """
    from tests.hub_server import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub_server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
