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
