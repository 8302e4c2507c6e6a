"""Offline verification of what the lock service signs: grants (`grants`) and operator
assertions (`assertions`), for the enforcement points (the rail proxy, the payment store) and
the worker, which check them without calling the lock service.

Owns: the signed forms, their canonical bytes, and verification against public keys.
Must never: import the lock server or the SDK (lockservice.server, lockservice.sdk), load a
private key, call the lock service, or decide whether a token is the newest (the fence does).
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from lockservice.verifiers.assertions import (
        ACTIONS,
        DEFAULT_TTL_S,
        MAX_TTL_S,
        AssertionRefused,
        AssertionVerifier,
        OperatorAssertion,
    )
    from lockservice.verifiers.grants import (
        BadSignature,
        GrantError,
        GrantExpired,
        GrantVerifier,
        KeyMismatch,
        MalformedGrant,
        MissingGrant,
        SignedGrant,
        TokenMismatch,
        UnknownKeyId,
        check_key,
        check_not_expired,
        is_expired,
        load_public_keys,
        verifier_from_settings,
    )

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "ACTIONS": "lockservice.verifiers.assertions",
    "AssertionRefused": "lockservice.verifiers.assertions",
    "AssertionVerifier": "lockservice.verifiers.assertions",
    "BadSignature": "lockservice.verifiers.grants",
    "DEFAULT_TTL_S": "lockservice.verifiers.assertions",
    "GrantError": "lockservice.verifiers.grants",
    "GrantExpired": "lockservice.verifiers.grants",
    "GrantVerifier": "lockservice.verifiers.grants",
    "KeyMismatch": "lockservice.verifiers.grants",
    "MAX_TTL_S": "lockservice.verifiers.assertions",
    "MalformedGrant": "lockservice.verifiers.grants",
    "MissingGrant": "lockservice.verifiers.grants",
    "OperatorAssertion": "lockservice.verifiers.assertions",
    "SignedGrant": "lockservice.verifiers.grants",
    "TokenMismatch": "lockservice.verifiers.grants",
    "UnknownKeyId": "lockservice.verifiers.grants",
    "check_key": "lockservice.verifiers.grants",
    "check_not_expired": "lockservice.verifiers.grants",
    "is_expired": "lockservice.verifiers.grants",
    "load_public_keys": "lockservice.verifiers.grants",
    "verifier_from_settings": "lockservice.verifiers.grants",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "ACTIONS",
    "DEFAULT_TTL_S",
    "MAX_TTL_S",
    "AssertionRefused",
    "AssertionVerifier",
    "BadSignature",
    "GrantError",
    "GrantExpired",
    "GrantVerifier",
    "KeyMismatch",
    "MalformedGrant",
    "MissingGrant",
    "OperatorAssertion",
    "SignedGrant",
    "TokenMismatch",
    "UnknownKeyId",
    "check_key",
    "check_not_expired",
    "is_expired",
    "load_public_keys",
    "verifier_from_settings",
]
