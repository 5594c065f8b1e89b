"""Addresses the user types are read before any work: a bad port or a missing host is one line naming the
field and the value (exit 2), never a traceback from inside MLflow's or Ray's client, and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mocolab.config.addresses import check_host_port, check_url

REPO = Path(__file__).resolve().parents[2]
BAD_URLS = [
    ("http://127.0.0.1:50x0", "the port '50x0' is not a number in 1..65535"),
    ("http://127.0.0.1:99999", "the port '99999' is not a number in 1..65535"),
    ("https://mlflow.example:0/", "the port '0' is not a number in 1..65535"),
    ("http://:5000", "no host"),
    ("postgresql://mocolab@db:pg/mlflow", "the port 'pg' is not a number in 1..65535"),
]
BAD_RAY = [
    ("127.0.0.1:abc", "the port 'abc' is not a number in 1..65535"),
    ("10.0.0.1:70000", "the port '70000' is not a number in 1..65535"),
    ("ray://head:x", "the port 'x' is not a number in 1..65535"),
    (":6379", "no host"),
]


@pytest.mark.parametrize("url, message", BAD_URLS)
def test_a_bad_url_is_refused_naming_the_field(url, message):
    with pytest.raises(ValueError, match=f"^tracking URI: {url}: {message}"):
        check_url(url, "tracking URI")


@pytest.mark.parametrize("address, message", BAD_RAY)
def test_a_bad_ray_address_is_refused_naming_the_field(address, message):
    check = (lambda: check_url(address, "RAY_ADDRESS")) if "://" in address else \
        (lambda: check_host_port(address, "RAY_ADDRESS", 6379))
    with pytest.raises(ValueError, match=f"^RAY_ADDRESS: {address}: {message}"):
        check()


def test_good_addresses_pass_with_their_parts():
    assert check_url("http://user:secret@127.0.0.1:5000/path", "f") == ("127.0.0.1", 5000)
    assert check_url("https://[::1]:8443", "f") == ("::1", 8443)
    assert check_url("https://mlflow.example", "f") == ("mlflow.example", None)
    assert check_host_port("10.0.0.1:6380", "RAY_ADDRESS", 6379) == ("10.0.0.1", 6380)
    assert check_host_port("head", "RAY_ADDRESS", 6379) == ("head", 6379)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}


def test_train_and_study_refuse_a_bad_tracking_uri_before_any_work(tmp_path):
    url, message = BAD_URLS[0]
    commands = [[str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke"],
                [sys.executable, str(REPO / "experiments" / "momentum_ablation.py"), "--preset", "smoke"]]
    for argv in commands:
        res = subprocess.run(argv + ["--tracking-uri", url], cwd=tmp_path, env=_clean_env(), capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert f"tracking URI (--tracking-uri or MLFLOW_TRACKING_URI): {url}: {message}" in res.stderr
    assert list(tmp_path.iterdir()) == []  # no store, no run folder, no sweep folder


def test_a_bad_ray_address_is_named_not_tried_on_the_default_port(tmp_path):
    address, message = BAD_RAY[0]
    res = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke", "--set",
                          "run.num_workers=1"], cwd=tmp_path, env={**_clean_env(), "RAY_ADDRESS": address},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip() == f"mocolab: error: RAY_ADDRESS: {address}: {message}"
    assert list(tmp_path.iterdir()) == []


def test_a_storage_endpoint_with_a_bad_port_is_refused_before_any_work(tmp_path):
    """pyarrow would take port 99999 as 34463 and connect there; the URI's query and the environment are read."""
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    uri = "s3://bucket/runs?endpoint_override=127.0.0.1:99999&scheme=http"
    res = subprocess.run([mocolab, "train", "--preset", "smoke", "--storage", uri], cwd=tmp_path, env=_clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.strip().endswith("endpoint_override=127.0.0.1:99999: "
                                       "the port '99999' is not a number in 1..65535")
    res = subprocess.run([mocolab, "train", "--preset", "smoke", "--storage", "s3://bucket/runs"], cwd=tmp_path,
                         env={**_clean_env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:7x"}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "AWS_ENDPOINT_URL: http://127.0.0.1:7x: the port '7x' is not a number in 1..65535" in res.stderr
    assert list(tmp_path.iterdir()) == []
