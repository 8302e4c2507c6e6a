"""The lock server: the `LockBackend` contract over HTTP (FastAPI), its backends and its key.

Owns: the HTTP app and its per-app state (`app`, `state`, `wire`, `hotroute`, `breakglass`), the
process settings (`settings`), the Ed25519 signing of grants and operator assertions (the private
key never leaves this package), the two backends and their schema (`backends`, `migrations`),
the restore procedure (`restore`) and the restored-data watermark (`watermark`).
Must never: be imported by the SDK or the offline verifiers (lockservice.sdk,
lockservice.verifiers; a contract in pyproject.toml), reissue or lower a token for a key
(INV-04), let two grants of one key be valid at once (INV-06), decide lease expiry by a client's
clock, or hand out an unsigned grant (INV-07).
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from lockservice.server.app import app_from_settings, create_app, main
    from lockservice.server.backends import create_backend
    from lockservice.server.backends.etcd_client import EtcdTLSFiles, etcd_client
    from lockservice.server.settings import LockSettings
    from lockservice.server.signing import GrantSigner, KeyPairFiles, generate_keypair

#: Public name -> the module that defines it, imported on first use (common.lazy): the offline
#: tools (`deploy/gen_env.py`, `payouts db migrate`, which finds `migrations/` here) load no
#: FastAPI, asyncpg or aetcd by importing this package.
_EXPORTS = {
    "EtcdTLSFiles": "lockservice.server.backends.etcd_client",
    "GrantSigner": "lockservice.server.signing",
    "KeyPairFiles": "lockservice.server.signing",
    "LockSettings": "lockservice.server.settings",
    "app_from_settings": "lockservice.server.app",
    "create_app": "lockservice.server.app",
    "create_backend": "lockservice.server.backends",
    "etcd_client": "lockservice.server.backends.etcd_client",
    "generate_keypair": "lockservice.server.signing",
    "main": "lockservice.server.app",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "EtcdTLSFiles",
    "GrantSigner",
    "KeyPairFiles",
    "LockSettings",
    "app_from_settings",
    "create_app",
    "create_backend",
    "etcd_client",
    "generate_keypair",
    "main",
]
