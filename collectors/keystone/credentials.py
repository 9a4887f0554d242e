"""Probe credentials: the service user and one EC2 key pair, from a file and/or the environment.

Secrets never reach argv, logs, labels or error messages: they are held as ``SecretStr`` (whose
repr is ``'**********'``) and only unwrapped when a request body is built.

File (YAML or JSON, mode 0600 recommended)::

    username: opsloop-probe
    password: ...
    project: service
    user_domain: Default      # optional
    project_domain: Default   # optional
    ec2_access: 0f3e...       # optional: without a key pair the S3 probe is skipped
    ec2_secret: ...

Environment (overrides the file, field by field): ``OPSLOOP_KEYSTONE_USERNAME``, ``..._PASSWORD``,
``..._PROJECT``, ``..._USER_DOMAIN``, ``..._PROJECT_DOMAIN``, ``..._EC2_ACCESS``, ``..._EC2_SECRET``
(the prefix is configurable).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from opsloop.validation import YamlFileError, read_yaml


class CredentialsError(ValueError):
    """Probe credentials missing or malformed; the message names the field, never a value."""


class ProbeCredentials(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    username: str
    password: SecretStr
    project: str
    user_domain: str = "Default"
    project_domain: str = "Default"
    ec2_access: str | None = None
    ec2_secret: SecretStr | None = None


_FIELDS = tuple(ProbeCredentials.model_fields)


def load(file: Path | None, env_prefix: str, environ: Mapping[str, str] | None = None) -> ProbeCredentials:
    environ = os.environ if environ is None else environ
    data: dict[str, object] = {}
    if file is not None:
        try:   # the shared reader: its size, depth and alias bounds (an alias bomb stalled the collector)
            loaded = read_yaml(file)
        except YamlFileError as e:   # .bare: no byte or text of the file, which holds a secret
            raise CredentialsError(f"credentials file {file}: {e.bare}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise CredentialsError(f"credentials file {file}: expected a mapping of {', '.join(_FIELDS)}")
        data.update(loaded or {})
    for name in _FIELDS:
        value = environ.get(f"{env_prefix}{name.upper()}")
        if value:
            data[name] = value
    if "ec2_access" in data and "ec2_secret" not in data or "ec2_secret" in data and "ec2_access" not in data:
        raise CredentialsError("probe credentials: ec2_access and ec2_secret go together (one is missing)")
    try:
        return ProbeCredentials.model_validate(data)
    except ValidationError as e:
        # Name fields only: pydantic's message would include the input value.
        problems = sorted({f"{'.'.join(map(str, err['loc'])) or 'credentials'}: {err['msg']}"
                           for err in e.errors(include_url=False, include_input=False)})
        source = f"file {file} / env {env_prefix}*" if file else f"env {env_prefix}*"
        raise CredentialsError(f"probe credentials ({source}): {'; '.join(problems)}") from None

