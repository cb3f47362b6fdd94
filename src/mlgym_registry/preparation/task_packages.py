"""The packages a task needs, and whether an interpreter has them.

A task declares the packages its agent's code and its evaluator import: in ``requirements`` (our field, a list of
pip requirement strings) and, MLGym's way, in the requirements file ``requirements_path``. ``task_requirements``
reads both into one normalised list; ``missing_requirements`` says which of them an interpreter lacks (this one is
checked in-process, another by running it once). ``virtualenvs`` builds interpreters that lack nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from typing import TYPE_CHECKING

from ..errors import InvalidTaskError, MLGymRegistryError
from ..specs import TaskSpec

if TYPE_CHECKING:
    from packaging.requirements import Requirement


# -- what a task needs ---------------------------------------------------------------------------------------------
def task_requirements(spec: TaskSpec) -> list[str]:
    """The requirements ``spec`` declares, normalised (``normalise_requirement``), without duplicates.

    ``spec.requirements`` comes first; then the lines of ``spec.requirements_path`` (MLGym's field, resolved against
    the task's root) when that file exists, comments and blank lines skipped, except those naming a package that
    ``requirements`` names already: a task file can thereby replace a line of the file (e.g. ``jax`` for
    ``jax[cuda12]``). An invalid requirement raises ``InvalidTaskError`` naming the task.
    """
    own = [_parse(text, spec, "requirements") for text in (spec.requirements or [])]
    named = {requirement_name(text) for text in own}
    from_file = [text for text in _file_requirements(spec) if requirement_name(text) not in named]
    return list(dict.fromkeys(own + from_file))


def normalise_requirement(text: str) -> str:
    """A requirement string in one canonical spelling (``Scikit_Learn >=1.0`` -> ``scikit-learn>=1.0``): the
    canonical name, extras and version clauses sorted, then any URL and environment marker. ``ValueError`` when
    ``text`` is not a requirement."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        requirement = Requirement(text.strip())
    except InvalidRequirement as exc:
        raise ValueError(f"{text!r} is not a pip requirement: {exc}") from None
    extras = sorted(canonicalize_name(extra) for extra in requirement.extras)
    out = canonicalize_name(requirement.name) + (f"[{','.join(extras)}]" if extras else "")
    out += ",".join(sorted(str(clause) for clause in requirement.specifier))
    if requirement.url:
        out += f" @ {requirement.url}"
    if requirement.marker is not None:
        out += f"{' ' if requirement.url else ''}; {requirement.marker}"
    return out


def _parse(text: str, spec: TaskSpec, where: str) -> str:
    try:
        requirement = normalise_requirement(str(text))
    except ValueError as exc:
        raise InvalidTaskError(f"task {spec.id!r}: {where}: {exc}") from None
    if " @ " in requirement or requirement.startswith("@"):
        # a direct URL (file://, git+https://) would have pip build code of the task's choosing on the host at prepare
        raise InvalidTaskError(
            f"task {spec.id!r}: {where}: {str(text)!r} names a direct URL; a task names its packages by name and "
            "version, and pip's own configuration (pip config list) chooses where they come from")
    return requirement


def requirement_name(requirement: str) -> str:
    """The canonical distribution name of a requirement string (``Scikit_Learn>=1`` -> ``scikit-learn``)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def _file_requirements(spec: TaskSpec) -> list[str]:
    if not spec.requirements_path:
        return []
    path = spec.resolve_path(spec.requirements_path)
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise InvalidTaskError(
                f"task {spec.id!r}: {str(path)!r} holds the pip option {line!r}; only requirement lines are "
                "supported (configure indexes in pip's own configuration)"
            )
        found.append(_parse(line, spec, str(path)))
    return found


# -- which packages an interpreter has -----------------------------------------------------------------------------
def missing_requirements(requirements: Iterable[str], python: str | os.PathLike[str] | None = None) -> list[str]:
    """The requirements that ``python`` (default: this interpreter) does not satisfy, in their given order.

    A requirement is satisfied when its distribution is installed in a version its specifier allows (pre-releases
    count). Environment markers are evaluated for that interpreter (a requirement whose marker is false is never
    missing); extras are ignored. This interpreter is checked in-process; another one runs once with a small script
    (isolated mode, as the sandbox runs it: no ``PYTHONPATH``, no user site).
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    requirements = list(requirements)
    parsed = [Requirement(text) for text in requirements]
    names = sorted({canonicalize_name(req.name) for req in parsed})
    versions, environment = _inspect(names, python)
    missing = []
    for text, requirement in zip(requirements, parsed, strict=True):
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        if not _satisfies(versions.get(canonicalize_name(requirement.name)), requirement):
            missing.append(text)
    return missing


def _satisfies(version: str | None, requirement: Requirement) -> bool:
    from packaging.version import InvalidVersion

    if version is None:
        return False
    if not requirement.specifier:
        return True
    try:
        return requirement.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


_PROBE = r"""
import importlib.metadata, json, os, platform, sys
versions = {}
for name in json.loads(sys.argv[1]):
    try:
        versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
v = sys.implementation.version
full = f"{v.major}.{v.minor}.{v.micro}" + ("" if v.releaselevel == "final" else v.releaselevel[0] + str(v.serial))
print(json.dumps({"versions": versions, "environment": {
    "implementation_name": sys.implementation.name, "implementation_version": full, "os_name": os.name,
    "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}}))
"""
"""Run by another interpreter: the installed versions of the distributions named in ``argv[1]`` (a JSON list) and
its marker environment (the keys of ``packaging.markers.default_environment``), without needing ``packaging``."""


def _isolated_path() -> list[str]:
    """This interpreter's ``sys.path`` as the sandbox runs it (``-I``): without ``PYTHONPATH``, the user site or
    the current folder, which the driver may see and the sandbox does not."""
    import site

    left_out = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    if site.ENABLE_USER_SITE:
        left_out.add(os.path.abspath(site.getusersitepackages()))
    return [p for p in sys.path if p and os.path.abspath(p) not in left_out and os.path.abspath(p) != os.getcwd()]


def _inspect(names: list[str], python: str | os.PathLike[str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """The installed versions of ``names`` and the marker environment of ``python`` (None: this interpreter)."""
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        from packaging.markers import default_environment

        path = _isolated_path()
        versions = {}
        for name in names:
            found = next(iter(metadata.distributions(name=name, path=path)), None)
            if found is not None:
                versions[name] = found.version
        return versions, dict(default_environment())
    try:
        done = subprocess.run([os.fspath(python), "-I", "-c", _PROBE, json.dumps(names)], capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MLGymRegistryError(f"cannot ask {os.fspath(python)!r} which packages it has: {exc}") from None
    if done.returncode != 0:
        raise MLGymRegistryError(
            f"cannot ask {os.fspath(python)!r} which packages it has (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:]}"
        )
    report = json.loads(done.stdout)
    return report["versions"], report["environment"]
