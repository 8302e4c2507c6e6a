"""Shared foundation of the payout executor: settings, logging, metrics helpers, the embedded
real servers (PostgreSQL, etcd, Temporal) and the `payouts` command line.

Owns: process plumbing that every component needs. Must never: hold domain logic of a component
(locks, payouts, ledger, rail), or import a component package at module import time.
"""
