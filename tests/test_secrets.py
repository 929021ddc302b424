"""Secrets never shown: every way a Redis URL carries a credential to redis-py (the URL's
``user:password@``, percent-encoded or not; ``?password=``; ``?ssl_password=``) is redacted
in every CLI output and error line, against a real password-protected redis-server. The
view's JSON is checked in tests/airflow/test_view.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests import secure_redis
from tests.conftest import SEED_SENTENCES
from tridentflow.redisconn import redacted, scrubbed, url_secrets

ODD_PASSWORD = "p@ss:w/rd%+ &=x"
"""Characters a URL must percent-encode (and ``+``, which a query may decode as a space)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[secure_redis.SecureRedis]:
    started = secure_redis.start(tmp_path_factory.mktemp("secret-redis"))
    started.admin().execute_command(
        "ACL", "SETUSER", "odd", "reset", "on", f">{ODD_PASSWORD}", "~*", "&*", "+@all"
    )
    yield started
    started.stop()


def credential_forms(port: int) -> list[tuple[str, str]]:
    """(url, the secret in it) for every form a credential takes in a URL redis-py reads."""
    admin, odd = secure_redis.ADMIN_PASSWORD, ODD_PASSWORD
    host = f"127.0.0.1:{port}"
    return [
        (f"redis://default:{admin}@{host}/0", admin),
        (f"redis://:{admin}@{host}/0", admin),
        (f"redis://odd:{quote(odd, safe='')}@{host}/0", odd),
        (f"redis://{host}/0?password={admin}", admin),
        (f"redis://{host}/0?db=0&password={quote(admin)}&health_check_interval=5", admin),
        (f"redis://odd@{host}/0?password={quote(odd, safe='')}", odd),
    ]


def _never_shown(proc, *secrets: str) -> None:
    for text in (proc.stdout, proc.stderr):
        for secret in secrets:
            assert secret not in text, (secret, text[-500:])


def test_a_url_is_redacted_whatever_form_its_secrets_take():
    for url, secret in credential_forms(6379):
        shown = redacted(url)
        assert secret not in shown and quote(secret, safe="") not in shown, shown
        assert "***" in shown and "127.0.0.1:6379" in shown
        assert secret in url_secrets(url)
        assert secret not in scrubbed(f"login with {secret} failed at {url}", url)
    tls = "rediss://127.0.0.1:6380/0?ssl_ca_certs=/ca.crt&ssl_password=k3y-pa55"
    assert redacted(tls) == "rediss://127.0.0.1:6380/0?ssl_ca_certs=/ca.crt&ssl_password=***"
    assert redacted("unix:///run/redis.sock?password=zz&db=1") == (
        "unix:///run/redis.sock?password=***&db=1"
    )
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.servers
def test_no_output_of_any_command_shows_a_secret(tf, server, tmp_path: Path):
    seeds = "\n".join(SEED_SENTENCES) + "\n"
    for i, (url, secret) in enumerate(credential_forms(server.port)):
        env = {"TRIDENTFLOW_REDIS_URL": url, "TRIDENTFLOW_HOME": str(tmp_path / f"h{i}")}
        for args, stdin in [
            (("produce", "wordcount", "-"), seeds),
            (("run", "wordcount", "--engine", "local"), None),
            (("status", "wordcount", "--json"), None),
            (("query", "wordcount", "you"), None),
        ]:
            done = tf(*args, input=stdin, env=env)
            assert done.returncode == 0, (url, args, done.stderr)
            _never_shown(done, secret)
        # every error line that names the URL: unreachable, a refused login, a CA with redis://
        unreachable = url.replace(f":{server.port}/", ":1/")
        wrong = url.replace(quote(secret, safe=""), "Wr0ng-pw").replace(secret, "Wr0ng-pw")
        ca = tmp_path / "ca.crt"
        ca.write_text("not a certificate\n")
        for bad_env, extra in [
            ({"TRIDENTFLOW_REDIS_URL": unreachable}, ()),
            ({"TRIDENTFLOW_REDIS_URL": wrong}, ()),
            ({}, ("--redis-ca", str(ca))),
        ]:
            failed = tf("status", "wordcount", *extra, env={**env, **bad_env})
            assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1, (
                failed.stderr
            )
            assert "127.0.0.1" in failed.stderr, failed.stderr
            _never_shown(failed, secret, "Wr0ng-pw")
        # a secret in a parameter redis-py cannot use (ssl_password without TLS) is one line too
        odd = tf("status", "wordcount", env={**env, "TRIDENTFLOW_REDIS_URL": url + (
            "&" if "?" in url else "?") + "ssl_password=k3y-pa55"})  # fmt: skip
        _never_shown(odd, secret, "k3y-pa55")
