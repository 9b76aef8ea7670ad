"""What a test does when a system part it needs (Chromium, PostgreSQL, node, an agent CLI, shellcheck, the real
model) is not on this machine: a skip naming it and how to install it on a developer's machine, a failure
under CI=true, where the set-up installs every one of them."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(message: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
