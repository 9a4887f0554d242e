"""A real Keystone, its probe user and S3 users, and the S3 front end (nginx + gateway), on loopback.

:class:`KeystoneLab` is what the tests' session fixture uses::

    lab = KeystoneLab(workdir, s3_users=4).start()
    lab.keystone.url, lab.credentials_file, lab.frontend.url, lab.s3_keys
    lab.keystone.set_caching(False)
    lab.stop()
"""

from __future__ import annotations

from pathlib import Path

from .frontend import NginxFrontend, S3Gateway, s3_load, signed_get
from .provision import Ec2Key, KeystoneAdmin, ProbeUser, provision_probe_user, provision_s3_users, \
    write_credentials_file
from .server import KeystoneServer, KeystoneServerError, free_port, stop_process_group


class KeystoneLab:
    def __init__(self, workdir: Path, s3_users: int = 4, caching: bool = True, workers: int = 2,
                 frontend: bool = True) -> None:
        self.workdir = Path(workdir)
        self.keystone = KeystoneServer(self.workdir / "keystone", caching=caching, workers=workers)
        self.n_s3_users = s3_users
        self.with_frontend = frontend
        self.probe_user: ProbeUser | None = None
        self.s3_keys: list[Ec2Key] = []
        self.credentials_file = self.workdir / "probe-credentials.yaml"
        self.gateway: S3Gateway | None = None
        self.frontend: NginxFrontend | None = None

    def start(self) -> "KeystoneLab":
        try:
            self.keystone.setup()
            self.keystone.start()
            admin = KeystoneAdmin(self.keystone.url, self.keystone.admin)
            self.probe_user = provision_probe_user(admin)
            self.s3_keys = provision_s3_users(admin, self.n_s3_users)
            write_credentials_file(self.credentials_file, self.probe_user)
            if self.with_frontend:
                p = self.probe_user
                self.gateway = S3Gateway(self.keystone.url, p.username, p.password, p.project)
                self.gateway.start()
                self.frontend = NginxFrontend(self.workdir / "frontend", self.gateway.port)
                self.frontend.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.frontend:
            self.frontend.stop()
        if self.gateway:
            self.gateway.stop()
            self.gateway = None
        self.keystone.stop()

    def __enter__(self) -> "KeystoneLab":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["Ec2Key", "KeystoneAdmin", "KeystoneLab", "KeystoneServer", "KeystoneServerError", "NginxFrontend",
           "ProbeUser", "S3Gateway", "free_port", "provision_probe_user", "provision_s3_users", "s3_load",
           "signed_get", "stop_process_group", "write_credentials_file"]
