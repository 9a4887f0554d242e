"""URL credentials masked in text that is not a log line (errors put in an API's status, a config check)."""

from __future__ import annotations

import pytest

from opsloop.redact import MASK, redact_credentials, redact_url


@pytest.mark.parametrize("text, secret", [
    ("KafkaError: SASL_SSL://opsloop:s3cr3t@broker-1:9093 unreachable", "s3cr3t"),   # a Kafka listener name
    ("ConnectionError: https://elastic:p@ss@es.example:9200/_bulk", "p@ss"),          # '@' in the password
    ('{"url": "http://u:pw@127.0.0.1:9093/api"}', "pw"),
    ("svn+ssh://bob:hunter2@svn.example/repo", "hunter2"),
])
def test_credentials_in_a_url_are_masked_wherever_the_url_sits(text: str, secret: str) -> None:
    out = redact_credentials(text)
    assert secret not in out and MASK in out


def test_text_without_credentials_is_left_alone() -> None:
    text = "timed out after 5 s talking to http://127.0.0.1:9092 (user opsloop@example.org)"
    assert redact_credentials(text) == text
    assert redact_url("https://es.example:9200") == "https://es.example:9200"
