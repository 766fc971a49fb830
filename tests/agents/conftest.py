"""Fixtures of the agent tests: the loopback fake Messages API wired into the environment."""

from __future__ import annotations

import uuid

import pytest

from .fake_api import FakeMessagesAPI, Turn


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch):
    """Start a FakeMessagesAPI with a fresh key: `api(script)`; the process env points the CLI at it."""
    key = f"sk-ant-test-{uuid.uuid4().hex}"
    started: list[FakeMessagesAPI] = []

    def start(script: list[Turn | list]) -> FakeMessagesAPI:
        fake = FakeMessagesAPI(key, script).__enter__()
        started.append(fake)
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
        return fake

    yield start
    for fake in started:
        fake.__exit__()
