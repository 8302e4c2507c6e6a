"""Offline verification of what the lock service signs: grants (`grants`) and operator
assertions (`assertions`), for the enforcement points (the rail proxy, the payment store) and
the worker, which check them without calling the lock service.

Owns: the signed forms, their canonical bytes, and verification against public keys.
Must never: import the lock server or the SDK (lockservice.server, lockservice.sdk), load a
private key, call the lock service, or decide whether a token is the newest (the fence does).
"""

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
