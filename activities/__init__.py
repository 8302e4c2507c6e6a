"""Temporal activities: the side effects of a payout, each one step of UC-01.

Owns: calls to the lock service, the payment database and the rail proxy, each checked against
the current grant before it acts. Must never: retry a rail submission, act without a grant, or
swallow a fenced rejection (it is raised as a non-retryable error).
"""
