import pytest


@pytest.fixture
def workers(make_snapshot):
    """Snapshots of workers 10, 11, ... with the given running requests."""

    def make(*running):
        return [make_snapshot(10 + i, running_requests=r) for i, r in enumerate(running)]

    return make
