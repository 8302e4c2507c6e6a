"""The container image's HEALTHCHECK: `python -m common.healthcheck [URL]`.

Owns: one HTTP GET against the component's own health (or metrics) endpoint, exit 0 when it
answers 2xx within the timeout, 1 otherwise. URL from the argument, else `HEALTHCHECK_URL`; an
https URL is verified against `HEALTHCHECK_CA_FILE` (the CA that issued the component's own
certificate, docker-compose.yml's `tls-ca`) when set, else the system's trust store.
Must never: turn verification off, change anything, or call any other service than the one URL
it is given. Standard library only, so that a probe every few seconds costs no heavy import.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 4.0


def check(url: str, timeout_s: float = TIMEOUT_S, ca_file: str | None = None) -> str | None:
    """None when `url` answers 2xx, else a one-line reason. `ca_file`: the CA an https server's
    certificate must chain to (its host name is checked too)."""
    if not url.startswith(("http://", "https://")):
        return f"not an http(s) URL: {url!r}"
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:  # noqa: S310 - http(s) only, checked above
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} unreachable: {exc}"
    return None if 200 <= status < 300 else f"{url} answered {status}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else os.environ.get("HEALTHCHECK_URL", "")
    if not url:
        sys.stderr.write("error: HEALTHCHECK_URL is not set (or pass the URL)\n")
        return 1
    reason = check(url, ca_file=os.environ.get("HEALTHCHECK_CA_FILE") or None)
    if reason is not None:
        sys.stderr.write(f"unhealthy: {reason}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
