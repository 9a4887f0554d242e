"""Package layout (the metadata is in pyproject.toml): the repository keeps its top-level folders, the
wheel installs them under the ``opsloop`` namespace, so no top-level ``collectors``/``streams``/
``controllers`` package collides with other software.

    collectors/  -> opsloop.collectors        alerts/      -> opsloop.alerts      (rules, templates: data)
    streams/     -> opsloop.streams           dashboards/  -> opsloop.dashboards  (JSON, provisioning: data)
    controllers/ -> opsloop.controllers       bench/, tests/: development only, not in the wheel
    lab/         -> opsloop.lab               (the demo and test equipment `opsloop run` drives)

An editable install (``pip install -e .``) maps the same names onto these folders.
"""

from __future__ import annotations

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

# repository folder -> package name in the wheel
MAPPED = {"collectors": "opsloop.collectors", "streams": "opsloop.streams", "controllers": "opsloop.controllers",
          "lab": "opsloop.lab", "alerts": "opsloop.alerts", "dashboards": "opsloop.dashboards"}
# shipped for their files only: no module of theirs goes into the wheel (dashboards/generate.py is a dev tool)
DATA_ONLY = ("opsloop.alerts", "opsloop.dashboards")
EXCLUDE = ["__pycache__", "*.__pycache__"]


def packages() -> list[str]:
    out = find_namespace_packages(include=["opsloop", "opsloop.*"], exclude=EXCLUDE)
    for folder, name in MAPPED.items():
        out += [name] + [f"{name}.{p}" for p in find_namespace_packages(where=folder, exclude=EXCLUDE)]
    return sorted(out)


class BuildPy(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        if package.startswith(DATA_ONLY):
            return []
        return super().find_package_modules(package, package_dir)


setup(packages=packages(), package_dir={"opsloop": "opsloop", **{name: folder for folder, name in MAPPED.items()}},
      cmdclass={"build_py": BuildPy})
