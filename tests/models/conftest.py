"""The session-wide loaded checkpoints (see lm_runs.py)."""

import pytest
from lm_runs import Runs


@pytest.fixture(scope="session")
def runs() -> Runs:
    return Runs()
