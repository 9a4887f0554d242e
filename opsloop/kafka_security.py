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
:func:`faust_credentials` translate the one block; every client takes them through
:mod:`opsloop.kafka_clients`, never by hand. The password is a ``SecretStr``: `config check` and logs
print ``**********``. :func:`preflight` (run by every service at start) turns a rejected login or an
untrusted certificate into one clear error instead of a client retrying until its time-out.
"""

from __future__ import annotations

import logging
import ssl
import threading
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from opsloop.private_file import OpenToOthers, PrivateFileError, read_private_file

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecurityError(ValueError):
    """The security settings cannot be used; the message names the setting."""


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    """A secret from a file only its owner can read (0600/0400); anything looser is refused, and so is a FIFO,
    a device or a file over 4 KiB (:func:`opsloop.private_file.read_private_file`: never waited on)."""
    try:
        text = read_private_file(path).decode()
    except OSError as e:
        raise KafkaSecurityError(f"{setting} {path}: {e.strerror}") from None
    except OpenToOthers as e:
        raise KafkaSecurityError(f"{setting} {path} is readable by others (mode {e.mode:04o}); chmod 600 it") from None
    except PrivateFileError as e:
        raise KafkaSecurityError(f"{setting} {path}: {e}") from None
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


class KafkaUnreachable(KafkaSecurityError):
    """No broker answered at all (refused, timed out): not a settings problem, a client may retry."""


# What kafka-python logs when TLS or SASL fails, matched while the preflight connects.
_TLS_FAILED = ("CERTIFICATE_VERIFY_FAILED", "Handshake failed", "WRONG_VERSION_NUMBER", "certificate verify failed")
_SASL_FAILED = ("Authentication failed", "SaslAuthenticationFailed", "authentication failed")
_UNREACHABLE = ("ECONNREFUSED", "Connection refused", "EHOSTUNREACH", "ENETUNREACH", "timed out",
                "Name or service not known", "nodename nor servname")


class _Recorder(logging.Handler):
    """Collects the kafka client's warnings during the preflight and spots a decisive failure early."""

    def __init__(self, sec: KafkaSecurity, threads: set[str]) -> None:
        super().__init__(logging.WARNING)
        self.sec = sec
        self.threads = threads   # only this preflight's client: an earlier one may still be retrying
        self.messages: list[str] = []
        self.verdict: str | None = None   # "tls" | "sasl" once the failure is certain
        self.decided = threading.Event()
        self._sasl_drops = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.threadName not in self.threads:
            return
        msg = record.getMessage()
        self.messages.append(msg)
        if self.verdict:
            return
        if any(m in msg for m in _TLS_FAILED):
            self.verdict = "tls"
        elif any(m in msg for m in _SASL_FAILED):
            self.verdict = "sasl"
        elif self.sec.uses_sasl and "broker_version=(" in msg and "disconnected" in msg:
            # The broker answered ApiVersions (so TCP and TLS work) and then dropped the socket: that is
            # how it ends a failed SASL exchange. Twice in a row, so a single hiccup is not a verdict.
            self._sasl_drops += 1
            if self._sasl_drops >= 2:
                self.verdict = "sasl"
        if self.verdict:
            self.decided.set()


# Preflights whose clients still run (a verdict returns before its client gives up): the kafka
# logger stays quiet until the last one ends, and then gets back what it had before the first.
_QUIET_LOCK = threading.Lock()
_quiet: dict[str, Any] = {"clients": 0, "propagate": True}


def _quiet_kafka(kafka_log: logging.Logger, on: bool) -> None:
    with _QUIET_LOCK:
        if on:
            if _quiet["clients"] == 0:
                _quiet["propagate"] = kafka_log.propagate
            _quiet["clients"] += 1
            kafka_log.propagate = False
        else:
            _quiet["clients"] -= 1
            if _quiet["clients"] == 0:
                kafka_log.propagate = _quiet["propagate"]


def preflight(bootstrap: str, sec: KafkaSecurity, timeout_s: float = 10.0) -> None:
    """Connect once and say plainly why it fails: raises :class:`KafkaSecurityError` naming the cause.

    kafka-python retries a rejected login or an untrusted certificate until its bootstrap time-out and
    then reports only "Unable to bootstrap" (over TLS, a failed SCRAM exchange shows as a dropped
    socket). Services call this at start, so a wrong password or CA stops them at once (as soon as the
    failure is certain, usually well under a second) with an error naming the user, the mechanism and
    what the client saw. :class:`KafkaUnreachable` (a subclass) means no broker answered within
    ``timeout_s``: not a settings error, and a service that tolerates an outage may go on.
    The password is never part of the message.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    opts = kafka_python_options(sec)   # raises KafkaSecurityError for an unreadable password or CA file
    client_id = f"opsloop-preflight-{uuid.uuid4().hex[:8]}"
    # kafka-python logs from the caller's thread and from its IO thread, named after the client id.
    recorder = _Recorder(sec, {f"{client_id}-connect", f"kafka-io-{client_id}"})
    kafka_log = logging.getLogger("kafka")
    outcome: list[BaseException | None] = []
    # The client's own retry chatter would bury the one line that matters: keep it out of the logs
    # while the preflight's client runs (the recorder still sees it). A verdict returns before that
    # client gives up, and its last lines ("Connection lost: … SaslAuthenticationFailedError", at
    # error level) then reached the service's log beside its one clear line: the wiring is put back
    # by whichever ends last, the preflight or its client's threads.
    unwire_lock = threading.Lock()
    ended: list[str] = []

    def unwire(who: str) -> None:
        with unwire_lock:
            ended.append(who)
            if len(ended) == 2:
                kafka_log.removeHandler(recorder)
                _quiet_kafka(kafka_log, False)

    def connect() -> None:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id,
                                     request_timeout_ms=int(timeout_s * 1000),
                                     bootstrap_timeout_ms=int(timeout_s * 1000), **opts)
            admin.close()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(e)
        finally:
            recorder.decided.set()
            # its IO thread logs the bootstrap's end ("Bootstrap failed") as the constructor gives up
            for t in threading.enumerate():
                if t.name == f"kafka-io-{client_id}":
                    t.join(2.0)
            unwire("client")

    kafka_log.addHandler(recorder)
    _quiet_kafka(kafka_log, True)
    try:
        thread = threading.Thread(target=connect, name=f"{client_id}-connect", daemon=True)
        thread.start()
        recorder.decided.wait(timeout_s + 5)
    finally:
        unwire("preflight")
    if outcome and outcome[0] is None:
        return
    error = outcome[0] if outcome else None
    if error is not None and not isinstance(error, KafkaError):
        raise error
    who = (f"as {sec.username!r} with {sec.sasl_mechanism} over {sec.protocol}" if sec.uses_sasl
           else f"over {sec.protocol}")
    where = f"Kafka at {bootstrap} {who}"
    seen = [m for m in recorder.messages if any(k in m for k in (*_TLS_FAILED, *_SASL_FAILED, "Connection"))]
    detail = f"; the client saw: {seen[-1][:300]}" if seen else ""
    if recorder.verdict == "tls":
        trust = f"ssl_cafile {sec.ssl_cafile}" if sec.ssl_cafile else "the system trust store (no ssl_cafile set)"
        raise KafkaSecurityError(f"TLS handshake with {where} failed: the broker's certificate is not trusted by "
                                 f"{trust}, or its name does not match (kafka.security.ssl_cafile){detail}")
    if recorder.verdict == "sasl":
        raise KafkaSecurityError(f"login to {where} rejected: the broker rejected the login or dropped it during "
                                 f"SASL authentication: check kafka.security.username, its password and that "
                                 f"{sec.sasl_mechanism} is enabled on the listener{detail}")
    answered = any("broker_version=(" in m for m in recorder.messages)
    refused = any(k in m for m in recorder.messages for k in _UNREACHABLE)
    if not answered and (refused or not recorder.messages):
        raise KafkaUnreachable(f"cannot connect to {where} within {timeout_s:g} s: no broker answered: check "
                               f"kafka.bootstrap_servers and that the brokers are up{detail}")
    hint = "check the listener's protocol (kafka.security.protocol) and the CA file"
    raise KafkaSecurityError(f"cannot connect to {where} within {timeout_s:g} s: {hint} "
                             f"({type(error).__name__ if error else 'no answer'}){detail}")
