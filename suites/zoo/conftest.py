"""Fixtures of the zoo suite: a session folder for checkpoints, and no network."""

import socket

import pytest


@pytest.fixture(scope="session")
def zoo_root(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture
def offline(monkeypatch):
    """No network: the hub is told so, and any socket connection fails."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise OSError("network access attempted while offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
