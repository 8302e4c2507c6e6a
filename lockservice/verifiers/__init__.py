"""Offline verification of what the lock service signs: grants (`grants`) and operator
assertions (`assertions`), for the enforcement points (the rail proxy, the payment store) and
the worker, which check them without calling the lock service.

Owns: the signed forms, their canonical bytes, and verification against public keys.
Must never: import the lock server or the SDK (lockservice.server, lockservice.sdk), load a
private key, call the lock service, or decide whether a token is the newest (the fence does).
"""
