"""The images of the compose smoke run: the project image from the shipped Dockerfile, and the
stand-ins of the third-party images, built here from Debian and PyPI packages because no public
registry is reachable from this kind of machine (docs/deploy-compose.md, "Stand-in images").

Owns: the list of stand-ins (which build context makes which image, tagged with the exact names
docker-compose.yml uses), the debootstrapped Debian base they and the Dockerfile's `FROM` stand
on, and building whatever is missing (a warm run builds nothing but the project image, whose
layers are cached).
Must never: pull, push or remove an image, or build with anything but the shipped Dockerfile for
the project image. Without stand-ins (`--real-images`) it builds the project image only and the
engine pulls the real images.

The build trusts this machine's CA bundle (a TLS-intercepting proxy sits in front of PyPI here):
the bundle and a pip.conf naming it are mounted into the build's RUN steps only, never copied
into an image.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.compose.engine import Engine
from lab.compose.plan import qualified_image

__all__ = ["BASE", "PROJECT_IMAGE", "STANDINS", "Standin", "build_images"]

#: The project image, as docker-compose.yml names it (x-app).
PROJECT_IMAGE = "localhost/fenced-payouts:dev"
#: The debootstrapped Debian bookworm with Debian's python3: the stand-ins' base.
BASE = "localhost/fenced-payouts-standin/debian-python:bookworm"
#: The Dockerfile's `ARG PYTHON_IMAGE` default, which the same base stands in for.
PYTHON_IMAGE = "python:3.11.11-slim-bookworm"
#: What the base holds besides minbase: Python for the Dockerfile (venv, pip), passwd for its
#: useradd, the CA certificates the official python image has.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd", "ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: The label each stand-in carries: the digest of its build context (and of the project image it
#: takes binaries or code from), so that a stand-in built from an older context or project image
#: is rebuilt, not reused; the layer cache keeps that cheap.
CONTEXT_LABEL = "io.fenced-payouts.standin-context"


@dataclass(frozen=True)
class Standin:
    context: str  # under deploy/images/
    tags: tuple[str, ...]  # the names docker-compose.yml uses
    needs_project_image: bool  # copies its binaries out of the project image (pinned versions)


STANDINS: tuple[Standin, ...] = (
    Standin("postgres", ("postgres:16.4-bookworm",), needs_project_image=True),
    Standin("etcd", ("gcr.io/etcd-development/etcd:v3.5.16",), needs_project_image=True),
    Standin(
        "temporal",
        ("temporalio/auto-setup:1.25.2", "temporalio/admin-tools:1.25.2"),
        needs_project_image=True,
    ),
    Standin("prometheus", ("prom/prometheus:v2.55.1",), needs_project_image=False),
)


def _exists(engine: Engine, image: str) -> bool:
    proc = engine.run(["podman", "image", "exists", image], timeout_s=60, check=False)
    return proc.returncode == 0


def _build_args(trust: Path) -> list[str]:
    """The machine's CA trust for the RUN steps (see the module docstring)."""
    return [
        "-v",
        f"{trust / 'pip.conf'}:/etc/pip.conf:ro",
        "-v",
        f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro",
    ]


def build_base(engine: Engine, run_dir: Path, progress: Callable[[str], None]) -> None:
    """debootstrap a minbase bookworm with BASE_PACKAGES, import it as BASE and tag it as the
    Dockerfile's python image; skipped when BASE exists."""
    if _exists(engine, BASE):
        progress(f"image {BASE}: present")
    else:
        progress(f"image {BASE}: debootstrap bookworm (about a minute)")
        rootfs = run_dir / "rootfs"
        engine.run(["rm", "-rf", str(rootfs)])
        engine.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
            ],
            timeout_s=1200,
        )
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(
                ["podman", "import", "--change", 'CMD ["python3"]', "-", BASE],
                stdin=tar.stdout,
                env=engine.env,
                capture_output=True,
                check=False,
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
        engine.run(["rm", "-rf", str(rootfs)])
        if imported.returncode != 0:
            raise RuntimeError(f"podman import failed: {imported.stderr.decode()[-500:]}")
    engine.podman("tag", BASE, qualified_image(PYTHON_IMAGE))


def build_project(
    engine: Engine, trust: Path, progress: Callable[[str], None], *, pull: bool
) -> None:
    """The shipped Dockerfile, as docker-compose.yml's `build:` says (context ., Dockerfile)."""
    progress(f"image {PROJECT_IMAGE}: building the shipped Dockerfile")
    before = _image_id(engine, PROJECT_IMAGE)
    engine.run(
        [
            "podman",
            "build",
            f"--pull={'missing' if pull else 'never'}",
            *_build_args(trust),
            "-t",
            PROJECT_IMAGE,
            "-f",
            "Dockerfile",
            ".",
        ],
        timeout_s=1800,
    )
    if before and before != _image_id(engine, PROJECT_IMAGE):
        # The image this build replaced (ours, now untagged): ~700 MB a rebuild otherwise.
        # Refused, and kept, while a container or another tag still uses it.
        engine.run(["podman", "rmi", before], timeout_s=120, check=False)


def _image_id(engine: Engine, image: str) -> str:
    proc = engine.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", image], timeout_s=60, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def context_digest(folder: Path) -> str:
    """sha256 over the build context's files (names and contents), in a stable order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _label(engine: Engine, image: str) -> str:
    proc = engine.run(
        [
            "podman",
            "image",
            "inspect",
            "--format",
            f'{{{{index .Labels "{CONTEXT_LABEL}"}}}}',
            image,
        ],
        timeout_s=60,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def build_standin(engine: Engine, standin: Standin, progress: Callable[[str], None]) -> None:
    tags = [qualified_image(t) for t in standin.tags]
    context = engine.root / "deploy" / "images" / standin.context
    digest = context_digest(context)
    if standin.needs_project_image:  # what it takes from the project image is part of it too
        digest = hashlib.sha256(f"{digest} {_image_id(engine, PROJECT_IMAGE)}".encode()).hexdigest()
    if all(_exists(engine, t) and _label(engine, t) == digest for t in tags):
        progress(f"stand-in {', '.join(standin.tags)}: present")
        return
    progress(f"stand-in {', '.join(standin.tags)}: building deploy/images/{standin.context}")
    tag_args = [a for t in tags for a in ("-t", t)]
    engine.run(
        [
            "podman",
            "build",
            "--pull=never",
            "--label",
            f"{CONTEXT_LABEL}={digest}",
            *tag_args,
            f"deploy/images/{standin.context}",
        ],
        timeout_s=1800,
    )


def build_images(
    engine: Engine,
    run_dir: Path,
    progress: Callable[[str], None],
    *,
    standins: bool,
    only: Sequence[Standin] = STANDINS,
) -> None:
    """Everything the compose file needs that a registry would otherwise give."""
    with tempfile.TemporaryDirectory(prefix="compose-trust-") as tmp:
        trust = Path(tmp)
        (trust / "pip.conf").write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
        if standins:
            build_base(engine, run_dir, progress)
        build_project(engine, trust, progress, pull=not standins)
    if standins:
        for standin in only:
            build_standin(engine, standin, progress)
