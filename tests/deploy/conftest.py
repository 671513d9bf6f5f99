import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deploy: builds the images and runs the compose stack (needs a Docker engine)"
    )
