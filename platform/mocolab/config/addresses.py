"""Addresses a user types (a tracking server, a Ray cluster), read before any work starts.

A port that is not a number, or not in 1..65535, otherwise surfaces far from where it was typed: as
``http.client.InvalidURL`` with a traceback from inside MLflow's client, or (for ``RAY_ADDRESS=host:x``)
as a connection refused on Ray's default port, which names the wrong problem. Here it is one error that
names the field and the value.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

TRACKING_FIELD = "tracking URI (--tracking-uri or MLFLOW_TRACKING_URI)"


def _port_text(netloc: str) -> str | None:
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):  # [IPv6]:port
        return hostport.partition("]")[2].lstrip(":") or None
    return hostport.rpartition(":")[2] if ":" in hostport else None


def _check_port(text: str | None, field: str, shown: str) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{field}: {shown}: the port {text!r} is not a number in 1..65535")
    return int(text)


def check_url(url: str, field: str, shown: str | None = None, *, host_needed: bool = True) -> tuple[str, int | None]:
    """(host, port or None) of ``scheme://[user@]host[:port]/...``; a clear error for a bad port or no host."""
    shown = shown or url
    parts = urlsplit(url)
    port = _check_port(_port_text(parts.netloc), field, shown)
    if host_needed and not parts.hostname:
        raise ValueError(f"{field}: {shown}: no host (expected {parts.scheme or 'scheme'}://HOST[:PORT]/...)")
    return parts.hostname or "", port


def check_host_port(address: str, field: str, default_port: int) -> tuple[str, int]:
    """(host, port) of ``host[:port]`` (Ray's GCS address form)."""
    host, sep, port_text = address.rpartition(":")
    if not sep:
        host, port_text = address, ""
    if not host:
        raise ValueError(f"{field}: {address}: no host (expected HOST:PORT)")
    return host, _check_port(port_text, field, address) or default_port


def check_tracking_url(uri: str) -> None:
    """A tracking URI of a server or database (``scheme://...``; not sqlite or file) has a usable port."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", uri) and not uri.startswith(("sqlite:", "file:")):
        shown = re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", uri)  # no password in an error message
        check_url(uri, TRACKING_FIELD, shown, host_needed=uri.startswith(("http://", "https://")))


def check_ray_address(address: str | None) -> tuple[str, int] | None:
    """(host, port) of ``RAY_ADDRESS`` (``host[:port]``, ``ray://``, ``http://``); None when unset or auto."""
    if not address or address == "auto":
        return None
    if "://" in address:
        host, port = check_url(address, "RAY_ADDRESS")
        return host, port or (8265 if address.startswith("http") else 10001)
    return check_host_port(address, "RAY_ADDRESS", 6379)


def check_addresses(tracking_uri: str | None) -> None:
    """Both addresses a command reads, in the first lines of ``mocolab train`` and of a study, before the
    seconds of importing torch, Ray and MLflow."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_tracking_url(uri)
    check_ray_address(os.environ.get("RAY_ADDRESS"))


__all__ = ["TRACKING_FIELD", "check_addresses", "check_host_port", "check_ray_address", "check_tracking_url",
           "check_url"]
