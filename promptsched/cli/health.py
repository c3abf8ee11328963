"""``promptsched healthcheck``: is the service on this machine alive? The container image's
HEALTHCHECK. It asks ``/healthz`` at the address each live service process announced in the
data directory (ops/serving.py), so the port follows whatever set it; with no announcement
(the service has not listened yet, or cannot write its data directory) it asks the port this
shell's settings name."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from typing import Any

from promptsched import config as configuration
from promptsched.ops import serving


def _probe(url: str, timeout: float) -> str | None:
    """None when ``url``/healthz answers 200, else why not, in a few words."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=timeout) as response:
            return None if response.status == 200 else f"answered {response.status}"
    except urllib.error.HTTPError as exc:
        return f"answered {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"did not answer ({reason})"


def cmd_healthcheck(args: argparse.Namespace, config: configuration.Config) -> int:
    found = serving.announced(config.data_dir)
    if args.url:
        urls = [args.url.rstrip("/")]
    elif found:
        urls = [entry.url for entry in found]
    else:
        urls = [serving.local_url(config.http_host, config.http_port)]
    failed = [(url, why) for url in urls if (why := _probe(url, args.timeout)) is not None]
    for url, why in failed:
        print(f"promptsched: unhealthy: {url}/healthz {why}", file=sys.stderr)
    if not failed and not args.quiet:
        print("healthy: " + ", ".join(urls))
    return 1 if failed else 0


def register(sub: Any) -> None:
    check = sub.add_parser(
        "healthcheck",
        help="exit 0 when this machine's service answers /healthz (a container's health check)",
        description=(
            "Ask /healthz of every promptsched service on this machine, at the address each "
            "announced in the data directory when it started listening (so --http-port, a "
            "config file and PROMPTSCHED_HTTP_PORT are all followed); with none announced, at "
            "PROMPTSCHED_HTTP_HOST:PROMPTSCHED_HTTP_PORT. Exit 0 when all answer 200, else 1."
        ),
        epilog="example: promptsched healthcheck --quiet || echo unhealthy",
    )
    check.add_argument("--url", help="ask this base URL instead (e.g. http://127.0.0.1:9000)")
    check.add_argument(
        "--timeout", type=float, default=2.0, help="seconds to wait for an answer (default 2)"
    )
    check.add_argument("--quiet", action="store_true", help="print nothing when healthy")
    check.set_defaults(func=cmd_healthcheck)
