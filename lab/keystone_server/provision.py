"""Users, roles and EC2 credentials on the test Keystone, through its real v3 API (as an operator would).

- a probe user with the ``service`` role on project ``service`` (what RadosGW's Keystone user has),
  with its own EC2 key pair for the S3 signature probe;
- S3 users, each with ``member`` on project ``s3`` and one EC2 key pair, for load tests.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from .server import AdminCredentials


class ProvisionError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Ec2Key:
    user: str
    access: str
    secret: str


@dataclass(frozen=True, slots=True)
class ProbeUser:
    username: str
    password: str
    project: str
    ec2: Ec2Key


class KeystoneAdmin:
    """Minimal admin client (project-scoped admin token)."""

    def __init__(self, url: str, admin: AdminCredentials, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        resp = self.session.post(f"{self.url}/v3/auth/tokens", timeout=timeout_s, json={"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": admin.username, "domain": {"id": "default"}, "password": admin.password}}},
            "scope": {"project": {"name": admin.project, "domain": {"id": "default"}}}}})
        self._check(resp, "admin login", 201)
        self.session.headers["X-Auth-Token"] = resp.headers["X-Subject-Token"]

    @staticmethod
    def _check(resp: requests.Response, what: str, *ok: int) -> None:
        if resp.status_code not in ok:
            raise ProvisionError(f"{what}: HTTP {resp.status_code} {resp.text[:300]}")

    def _get_or_create(self, collection: str, key: str, name: str, body: dict) -> str:
        resp = self.session.get(f"{self.url}/v3/{collection}", params={"name": name}, timeout=self.timeout_s)
        self._check(resp, f"list {collection}", 200)
        found = resp.json()[collection]
        if found:
            return found[0]["id"]
        resp = self.session.post(f"{self.url}/v3/{collection}", json={key: body}, timeout=self.timeout_s)
        self._check(resp, f"create {key} {name}", 201)
        return resp.json()[key]["id"]

    def project(self, name: str) -> str:
        return self._get_or_create("projects", "project", name, {"name": name, "domain_id": "default"})

    def role(self, name: str) -> str:
        return self._get_or_create("roles", "role", name, {"name": name})

    def user(self, name: str, password: str, project_id: str) -> str:
        resp = self.session.get(f"{self.url}/v3/users", params={"name": name}, timeout=self.timeout_s)
        self._check(resp, "list users", 200)
        if resp.json()["users"]:
            user_id = resp.json()["users"][0]["id"]
            resp = self.session.patch(f"{self.url}/v3/users/{user_id}", timeout=self.timeout_s,
                                      json={"user": {"password": password}})
            self._check(resp, f"set password of {name}", 200)
            return user_id
        resp = self.session.post(f"{self.url}/v3/users", timeout=self.timeout_s, json={"user": {
            "name": name, "password": password, "domain_id": "default", "default_project_id": project_id}})
        self._check(resp, f"create user {name}", 201)
        return resp.json()["user"]["id"]

    def grant(self, project_id: str, user_id: str, role_id: str) -> None:
        resp = self.session.put(f"{self.url}/v3/projects/{project_id}/users/{user_id}/roles/{role_id}",
                                timeout=self.timeout_s)
        self._check(resp, "grant role", 204)

    def ec2_key(self, user_id: str, user_name: str, project_id: str) -> Ec2Key:
        resp = self.session.post(f"{self.url}/v3/users/{user_id}/credentials/OS-EC2", timeout=self.timeout_s,
                                 json={"tenant_id": project_id})
        self._check(resp, f"create EC2 credential for {user_name}", 201)
        cred = resp.json()["credential"]
        return Ec2Key(user_name, cred["access"], cred["secret"])


def provision_probe_user(admin: KeystoneAdmin, role: str = "service", username: str = "opsloop-probe",
                         password: str | None = None) -> ProbeUser:
    password = password or secrets.token_urlsafe(18)
    project_id = admin.project("service")
    user_id = admin.user(username, password, project_id)
    admin.grant(project_id, user_id, admin.role(role))
    return ProbeUser(username, password, "service", admin.ec2_key(user_id, username, project_id))


def provision_s3_users(admin: KeystoneAdmin, count: int, prefix: str = "s3-user") -> list[Ec2Key]:
    project_id = admin.project("s3")
    member = admin.role("member")
    keys = []
    for i in range(count):
        name = f"{prefix}-{i}"
        user_id = admin.user(name, secrets.token_urlsafe(18), project_id)
        admin.grant(project_id, user_id, member)
        keys.append(admin.ec2_key(user_id, name, project_id))
    return keys


def write_credentials_file(path: Path, probe: ProbeUser) -> Path:
    """The collector's probes.credentials_file, created 0600 (it holds a password and an EC2 secret)."""
    doc = {"username": probe.username, "password": probe.password, "project": probe.project,
           "ec2_access": probe.ec2.access, "ec2_secret": probe.ec2.secret}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f)
    return path
