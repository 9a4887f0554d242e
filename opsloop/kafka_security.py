"""Kafka TLS and SASL for every client opsloop makes: one settings block, three client dialects.

The ``kafka.security`` section of the config file::

    kafka:
      bootstrap_servers: kafka1:9093,kafka2:9093
      security:
        protocol: SASL_SSL              # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
        sasl_mechanism: SCRAM-SHA-512   # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
        username: opsloop-stream
        password_file: /etc/opsloop/secrets/kafka-password   # mode 0600 (or 0400), or:
        # OPSLOOP__KAFKA__SECURITY__PASSWORD in the service's environment (never in the file, never in argv)
        ssl_cafile: /etc/opsloop/kafka-ca.pem                # else the system's trust store
        ssl_certfile: null              # client certificate (mutual TLS), PEM
        ssl_keyfile: null

kafka-python (collectors, controllers, admin), aiokafka (benchmarks) and Faust (the stream worker) each
spell these options differently; :func:`kafka_python_options`, :func:`aiokafka_options` and
:func:`faust_credentials` translate the one block. The password is a ``SecretStr``: `config check` and
logs print ``**********``.
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecurityError(ValueError):
    """The security settings cannot be used; the message names the setting."""


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    protocol: Protocol = "PLAINTEXT"
    sasl_mechanism: Mechanism | None = None
    username: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = None
    password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> "KafkaSecurity":
        sasl = self.protocol.startswith("SASL_")
        if sasl:
            missing = [n for n in ("sasl_mechanism", "username") if getattr(self, n) is None]
            if self.password is None and self.password_file is None:
                missing.append("password or password_file")
            if missing:
                raise ValueError(f"protocol {self.protocol} needs {', '.join(missing)}")
            if self.password is not None and self.password_file is not None:
                raise ValueError("set password or password_file, not both")
        elif self.sasl_mechanism or self.username or self.password or self.password_file:
            raise ValueError(f"SASL settings given but protocol is {self.protocol} (use SASL_SSL or SASL_PLAINTEXT)")
        if not self.uses_tls and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            raise ValueError(f"TLS files given but protocol is {self.protocol} (use SSL or SASL_SSL)")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (mutual TLS)")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def secret(self) -> str:
        """The SASL password, from the setting (environment) or the 0600 file."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is None:
            raise KafkaSecurityError("kafka.security: no password or password_file")
        return read_secret_file(self.password_file, "kafka.security.password_file")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
            if self.ssl_certfile and self.ssl_keyfile:
                ctx.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile))
        except (OSError, ssl.SSLError) as e:
            raise KafkaSecurityError(f"kafka.security: TLS files unusable: {e}") from None
        ctx.check_hostname = self.ssl_check_hostname
        return ctx


def read_secret_file(path: Path, setting: str) -> str:
    """A secret from a file only its owner can read (0600/0400); anything looser is refused."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as e:
        raise KafkaSecurityError(f"{setting} {path}: {e.strerror}") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise KafkaSecurityError(f"{setting} {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                                 f"chmod 600 it")
    secret = text.strip()
    if not secret:
        raise KafkaSecurityError(f"{setting} {path} is empty")
    return secret


def kafka_python_options(sec: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
    opts: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.uses_tls:
        opts["ssl_context"] = sec.ssl_context()
    if sec.uses_sasl:
        opts.update(sasl_mechanism=sec.sasl_mechanism, sasl_plain_username=sec.username,
                    sasl_plain_password=sec.secret())
    return opts


def aiokafka_options(sec: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for aiokafka's clients (the same names as kafka-python's, its ancestor)."""
    return kafka_python_options(sec)


def faust_credentials(sec: KafkaSecurity) -> Any:
    """``broker_credentials`` for faust.App (None for PLAINTEXT)."""
    import faust

    if sec.uses_sasl:
        return faust.SASLCredentials(username=sec.username, password=sec.secret(), mechanism=sec.sasl_mechanism,
                                     ssl_context=sec.ssl_context())
    if sec.uses_tls:
        return faust.SSLCredentials(sec.ssl_context())
    return None



class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def preflight(bootstrap: str, sec: KafkaSecurity, timeout_s: float = 10.0) -> None:
    """Connect once and say plainly why it fails, within ``timeout_s``.

    kafka-python retries a rejected login until its bootstrap time-out and then reports only
    "Unable to bootstrap" (over TLS, a failed SCRAM exchange shows as a dropped socket): services call
    this at start so that a wrong password stops them at once with an error naming the user, the
    mechanism and what the client saw, instead of a worker that waits on a broker it may never join.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    recorder = _Recorder()
    kafka_log = logging.getLogger("kafka")
    kafka_log.addHandler(recorder)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="opsloop-preflight",
                                 request_timeout_ms=int(timeout_s * 1000), bootstrap_timeout_ms=int(timeout_s * 1000),
                                 **kafka_python_options(sec))
        admin.close()
    except KafkaError as e:
        seen = [m for m in recorder.messages if "Authentication" in m or "SSL" in m or "certificate" in m]
        who = (f"as {sec.username!r} with {sec.sasl_mechanism} over {sec.protocol}" if sec.uses_sasl
               else f"over {sec.protocol}")
        hint = ("the broker rejected the login or dropped it during SASL authentication: check the user, "
                "its password and that the mechanism is enabled on the listener") if sec.uses_sasl else \
            "check the listener's protocol and the CA file"
        detail = f"; the client saw: {seen[-1]}" if seen else ""
        raise KafkaSecurityError(f"cannot connect to Kafka at {bootstrap} {who} within {timeout_s:g} s: {hint}"
                                 f" ({type(e).__name__}){detail}") from None
    finally:
        kafka_log.removeHandler(recorder)
