"""``plog serve``: the Kafka-protocol gateway, and ``plog serve users`` for its credentials file."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from typing import TYPE_CHECKING

from pyspark_logsource.cli.common import EXIT_OK, ROOT_UNUSED, CliError, Env, create_root

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    if not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} of {text!r} is out of range (0 to 65535)")
    return host.strip("[]") or "127.0.0.1", int(port)


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog serve`` to ``commands``."""
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve the root to Kafka clients (a stateless Kafka-protocol gateway)",
        description="Listen for Kafka clients (librdkafka, Java, kafka-python, ...) and serve the root's "
        "topics and groups to them. The gateway keeps no state of its own: run any number against one root. "
        "It binds to 127.0.0.1 unless told otherwise; a listener without authentication (--users) refuses "
        "other addresses unless --allow-unauthenticated-remote is given.",
    )
    serve.add_argument("--listen", type=_address, default=("127.0.0.1", 9092), metavar="HOST:PORT")
    serve.add_argument(
        "--advertise",
        type=_address,
        default=None,
        metavar="HOST:PORT",
        help="the address clients are told to connect to (default: --listen's)",
    )
    serve.add_argument(
        "--users",
        metavar="FILE",
        help="SASL credentials (hashed; see `plog serve-users`): "
        "clients must authenticate with PLAIN or SCRAM-SHA-256/512",
    )
    serve.add_argument("--acls", metavar="FILE", help="ACLs by principal on topics, groups and transactional ids")
    serve.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    serve.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    serve.add_argument("--tls-ca", metavar="PEM", help="require client certificates signed by this CA")
    serve.add_argument(
        "--allow-unauthenticated-remote",
        action="store_true",
        help="allow a listener without --users on a non-loopback address",
    )
    serve.add_argument(
        "--flush-interval-ms",
        "--linger-ms",
        dest="flush_interval_ms",
        type=int,
        default=None,
        help="the least time between two flushes of produced records (group commit: a flush starts as soon as "
        "the previous one is done); 0 on a local root, 250 on an object store, where each flush costs about "
        "three PUTs",
    )
    serve.add_argument(
        "--batch-bytes",
        type=int,
        default=None,
        help="the most bytes one flush takes; a flush starts at once when this many wait (8 MiB)",
    )
    serve.add_argument(
        "--heartbeat-ms",
        type=int,
        default=None,
        help="how often this gateway renews its registration in the root (10000; each renewal is a PUT and a LIST)",
    )
    serve.add_argument(
        "--registration-ms",
        type=int,
        default=None,
        help="how long a registration keeps a silent gateway among the live ones (30000)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=None,
        help="refuse requests larger than this (Kafka's socket.request.max.bytes, 100 MiB)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve OpenMetrics (Prometheus) on 127.0.0.1:PORT: requests by API, bytes, connections, objects "
        "written, store requests (needs prometheus-client: pip install 'plog[metrics]')",
    )
    serve.add_argument(
        "--create",
        action="store_true",
        help="serve an empty root when --url holds none (created at start); without it such a --url is refused",
    )
    serve.set_defaults(handler=cmd_serve)

    users = commands.add_parser(
        "serve-users",
        help="add or remove a user of plog serve's credentials file",
        description="Keep the SASL credentials file of `plog serve --users`: only salted SCRAM hashes are "
        "stored. The password is read from stdin when it is not a terminal, else prompted for.",
    )
    users.add_argument("action", choices=("add", "remove"))
    users.add_argument("file", metavar="FILE")
    users.add_argument("user", metavar="USER")
    users.set_defaults(handler=cmd_serve_users, root=ROOT_UNUSED)


def cmd_serve(env: Env) -> int:
    """``plog serve``: run the gateway until SIGTERM or SIGINT, then drain, deregister and exit 0.

    Every setting is checked before anything is printed or written to the root; a listener that cannot bind
    is one line naming its address (exit 2), with nothing registered.
    """
    from pyspark_logsource.gateway import Gateway, GatewayConfig, run_gateway
    from pyspark_logsource.gateway.security.listener import check_listener

    args = env.args
    host, port = args.listen
    config = GatewayConfig(url=env.url, storage_options=env.options, host=host, port=port)
    if args.advertise is not None:
        config.advertised_host, config.advertised_port = args.advertise
    config.users_file = args.users
    config.acls_file = args.acls
    config.allow_unauthenticated_remote = args.allow_unauthenticated_remote
    for name in ("flush_interval_ms", "batch_bytes", "max_request_bytes", "heartbeat_ms", "registration_ms"):
        value = getattr(args, name)
        if value is not None:
            if value < 0:
                raise CliError(f"--{name.replace('_', '-')} must not be negative, got {value}")
            setattr(config, name, value)
    if not 0 < config.heartbeat_ms < config.registration_ms:
        raise CliError(
            f"--heartbeat-ms ({config.heartbeat_ms}) must be positive and below --registration-ms "
            f"({config.registration_ms}), or the gateway's registration lapses between renewals"
        )
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise CliError(f"--metrics-port {args.metrics_port} is out of range (0 to 65535)")
    check_listener(host, args.users is not None, args.allow_unauthenticated_remote)
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise CliError("--tls-cert and --tls-key go together")
        from pyspark_logsource.gateway.security.tls import server_ssl_context

        config.ssl_context = server_ssl_context(args.tls_cert, args.tls_key, args.tls_ca, args.tls_ca is not None)
    if args.create:
        create_root(env.url, env.options)

    def ready(gateway: Gateway, metrics: tuple[str, int] | None) -> None:
        env.note(f"plog serve: serving {env.url} on {host}:{gateway.port}", style="")
        if metrics is not None:
            env.note(f"plog serve: metrics on http://{metrics[0]}:{metrics[1]}/metrics", style="")
        env.note("plog serve: stop with Ctrl-C or SIGTERM (in-flight requests are answered first)")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_gateway(config, metrics_port=args.metrics_port, on_ready=ready)
    env.note("plog serve: stopped, deregistered")
    return EXIT_OK


def cmd_serve_users(env: Env) -> int:
    """``plog serve-users add|remove FILE USER``."""
    from pyspark_logsource.gateway.security.credentials import add_user_to_file, remove_user_from_file

    args = env.args
    if args.action == "remove":
        remove_user_from_file(args.file, args.user)
        return EXIT_OK
    password = (
        getpass.getpass(f"password for {args.user}: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    )
    if not password:
        raise CliError("an empty password is not allowed")
    add_user_to_file(args.file, args.user, password)
    return EXIT_OK
