"""A machine with no way out, as a test sets it up: HTTPS only through a proxy that refuses."""

import contextlib
import socket


@contextlib.contextmanager
def refusing_proxy(monkeypatch):
    """Every HTTPS request goes to a local port that is bound but never listens, so a
    connection is refused at once (no DNS, no timeout)."""
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        yield
