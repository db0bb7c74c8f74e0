"""`harnessrl operator`: run the kopf operator that reconciles TrainingRuns and HarnessPools."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

from harnessrl.runtime.contracts.server_limits import ServerLimits


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="harnessrl operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--standalone", action="store_true", help="no kopf peering objects (replicas coordinate by --leader-elect)"
    )
    parser.add_argument("--liveness", default=None,
                        help="serve the liveness probe (from kopf's loop), e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--resync-seconds", type=float, default=10.0, help="level-based resync period")
    parser.add_argument("--image-registry", default=None, help="registry of the component images")
    parser.add_argument("--image-tag", default=None, help="tag of the component images")
    parser.add_argument("--learner-url-template", default="", help="learner status URL; {run} and {namespace} filled in")
    parser.add_argument("--engine-pool-server-url-template", default="",
                        help="EnginePool server URL; {pool}, {namespace} and {replica} filled in")
    parser.add_argument("--engine-pool-store-url-template", default="",
                        help="EnginePool adapter store URL; {pool}, {namespace} and {replica} filled in")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file; default: in-cluster, then KUBECONFIG")
    parser.add_argument("--leader-elect", action="store_true",
                        help="run as one of several replicas: only the one holding the Lease reconciles")
    parser.add_argument("--lease-name", default="harnessrl-operator", help="the leader-election Lease")
    parser.add_argument("--lease-namespace", default=None, help="its namespace; default: the operator's own")
    parser.add_argument("--lease-duration-seconds", type=float, default=15.0,
                        help="a leader that stopped renewing is replaced after this long")
    parser.add_argument("--renew-deadline-seconds", type=float, default=10.0,
                        help="a leader that could not renew this long stops reconciling")
    parser.add_argument("--retry-period-seconds", type=float, default=2.0, help="between tries to take or renew")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    parser.add_argument("--head-timeout-seconds", type=float, default=ServerLimits().head_timeout_s,
                        help="a request's head to --liveness or --metrics-port must be whole this long after it began")
    parser.add_argument("--log-format", choices=["text", "json"], default=None,
                        help="log lines as text or one JSON object each; default: $HARNESSRL_LOG_FORMAT, else text")
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def api_client(kubeconfig: str | None) -> Any:
    """The official client, configured in-cluster (a Pod's ServiceAccount) or from a kubeconfig."""
    import kubernetes.client
    import kubernetes.config

    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config()
            return kubernetes.client.ApiClient()
        except kubernetes.config.ConfigException:
            pass
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from harnessrl.runtime import logs

    logs.configure(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    import kopf
    from harnessrl.operator.control.leader import LeaderElection, default_namespace
    from harnessrl.operator.endpoints import endpoints, serve_beside
    from harnessrl.operator.handlers import OperatorOptions, build_registry
    from harnessrl.operator.plan.types import Images

    images = Images().model_copy(
        update={k: v for k, v in {"registry": args.image_registry, "tag": args.image_tag}.items() if v}
    )
    election = None
    if args.leader_elect:
        try:
            election = LeaderElection(
                namespace=args.lease_namespace or default_namespace(), lease_name=args.lease_name,
                lease_duration_s=args.lease_duration_seconds, renew_deadline_s=args.renew_deadline_seconds,
                retry_period_s=args.retry_period_seconds,
            )
        except ValueError as exc:
            raise SystemExit(f"harnessrl operator: {exc}") from None
    options = OperatorOptions(
        resync_seconds=args.resync_seconds, images=images, learner_url_template=args.learner_url_template,
        engine_pool_server_url_template=args.engine_pool_server_url_template,
        engine_pool_store_url_template=args.engine_pool_store_url_template, leader_election=election,
        namespaces=args.namespace,
    )
    client = api_client(args.kubeconfig)
    registry, ctx = build_registry(options, client)
    try:
        servers = endpoints(args.liveness, args.metrics_port, ctx.metrics.registry,
                            ServerLimits(head_timeout_s=args.head_timeout_seconds))
    except ValueError as exc:
        raise SystemExit(f"harnessrl operator: {exc}") from None

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf talks to the same server, with the same credentials, as the client the handlers use; asking
        # the configuration for the token each time picks up a rotated ServiceAccount token.
        configuration = client.configuration
        header = configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
        token = header.split(" ", 1)[-1].strip() or None
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
            scheme="Bearer" if token else None,
            token=token,
        )

    # kopf.run(), with the operator's own bounded endpoints (endpoints.py) in place of kopf's liveness server.
    operator = kopf.operator(registry=registry, standalone=args.standalone, clusterwide=not args.namespace,
                             namespaces=args.namespace)
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(serve_beside(servers, operator))
    return 0
