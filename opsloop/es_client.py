"""Elasticsearch connection settings: a host list, API key or basic auth from a file or the environment, a CA.

The ``audit.elasticsearch`` section of the config file (used by the audit indexer, ``opsloop audit`` and
``opsloop logs``)::

    audit:
      elasticsearch:
        hosts: ["https://es1:9200", "https://es2:9200"]
        api_key_file: /etc/opsloop/secrets/es-api-key     # mode 0600 (or 0400); the key as Elasticsearch
                                                          # returns it ("encoded"), or id:api_key
        # or basic auth:
        # username: opsloop-audit
        # password_file: /etc/opsloop/secrets/es-password
        ca_file: /etc/opsloop/es-ca.pem                   # else the system's trust store

Secrets may instead come from the environment (``OPSLOOP__AUDIT__ELASTICSEARCH__API_KEY``,
``OPSLOOP__AUDIT__ELASTICSEARCH__PASSWORD``), never from the file itself or argv. A host URL carrying
``user:password@`` is refused: URLs end up in error messages and logs, credentials must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from opsloop.kafka_security import read_secret_file
from opsloop.validation import NoBoolNumbers


class ElasticsearchSettings(NoBoolNumbers):   # `request_timeout_s: yes` was 1 s
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    hosts: list[str] = Field(default_factory=list)
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    username: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)

    @field_validator("hosts")
    @classmethod
    def _plain_urls(cls, hosts: list[str]) -> list[str]:
        for i, url in enumerate(hosts):
            check_url(url, f"hosts[{i}]")
        return hosts

    @model_validator(mode="after")
    def _one_auth(self) -> "ElasticsearchSettings":
        key = self.api_key is not None or self.api_key_file is not None
        basic = self.username is not None or self.password is not None or self.password_file is not None
        if key and basic:
            raise ValueError("set an API key (api_key/api_key_file) or basic auth (username + password), not both")
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("set api_key or api_key_file, not both")
        if self.password is not None and self.password_file is not None:
            raise ValueError("set password or password_file, not both")
        if basic and (self.username is None or (self.password is None and self.password_file is None)):
            raise ValueError("basic auth needs username and password (or password_file)")
        return self

    def with_hosts(self, hosts: list[str]) -> "ElasticsearchSettings":
        return self.model_validate({**self.model_dump(exclude={"hosts"}), "hosts": hosts})

    def describe(self) -> str:
        """The hosts, for messages and logs (never carries credentials: they are refused in URLs)."""
        return ",".join(self.hosts)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for ``elasticsearch.Elasticsearch`` (secrets read now, from file or setting)."""
        opts: dict[str, Any] = {"hosts": list(self.hosts), "request_timeout": self.request_timeout_s}
        if self.api_key is not None:
            opts["api_key"] = self.api_key.get_secret_value()
        elif self.api_key_file is not None:
            opts["api_key"] = read_secret_file(self.api_key_file, "elasticsearch.api_key_file")
        if self.username is not None:
            if self.password is not None:
                password = self.password.get_secret_value()
            else:
                assert self.password_file is not None   # the model validator guarantees one of them
                password = read_secret_file(self.password_file, "elasticsearch.password_file")
            opts["basic_auth"] = (self.username, password)
        if self.ca_file is not None:
            if not self.ca_file.is_file():
                raise ValueError(f"elasticsearch.ca_file {self.ca_file}: no such file")
            opts["ca_certs"] = str(self.ca_file)
        return opts

    def client(self, **overrides: Any) -> Any:
        """An ``Elasticsearch`` client (``overrides``: e.g. ``max_retries=0`` for the indexer)."""
        from elasticsearch import Elasticsearch

        if not self.hosts:
            raise ValueError("elasticsearch: no hosts configured")
        return Elasticsearch(**{**self.client_options(), **overrides})


def check_url(url: str, setting: str) -> str:
    """``url`` must be http(s)://host[:port][/path] without credentials; ValueError names the setting."""
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise ValueError(f"{setting}: not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{setting}: must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{setting}: credentials in the URL are refused (they would reach logs); set "
                         f"username + password_file or api_key_file instead")
    return url
