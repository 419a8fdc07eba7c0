"""The few Kubernetes API calls the status sync makes, through the official client in threads.

kopf talks to the API for the handlers; the sync runs outside any handler, so it patches
``/status`` and posts Events itself — as the same ServiceAccount, with the same RBAC.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from schedlock.core.aio import utcnow
from schedlock.core.logs import Event
from schedlock.operator.crd import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger("schedlock.operator.kube")
COMPONENT = "schedlock-operator"


class KubeError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class Kube:
    """The calls.  The client's configuration loads at the first call, not when made: a load
    that fails then fails the sync's run, which its supervisor restarts with back-off."""

    @functools.cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._api)

    @functools.cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api)

    @functools.cached_property
    def _api(self) -> client.ApiClient:
        return _api_client()

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        def call() -> dict[str, Any] | None:
            try:
                obj = cast(
                    "dict[str, Any]",
                    self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, name
                    ),
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise KubeError(f"get {namespace}/{name}: {exc.reason}", exc.status) from exc
            return obj

        return await asyncio.to_thread(call)

    async def list_page(
        self, namespace: str | None, token: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the ScheduledPublish objects of ``namespace`` (None: every namespace)
        from ``token`` on (None: the first): its objects and the next page's token (None: the
        last page).  A token that expired (410) fails the listing, which then starts over."""

        def call() -> tuple[list[dict[str, Any]], str | None]:
            page: dict[str, Any] = {"limit": limit}
            if token:
                page["_continue"] = token
            try:
                if namespace is None:
                    found = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **page)
                else:
                    found = self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, **page
                    )
            except ApiException as exc:
                where = namespace or "every namespace"
                raise KubeError(f"list {PLURAL} in {where}: {exc.reason}", exc.status) from exc
            listing = cast("dict[str, Any]", found)
            return listing.get("items") or [], (listing.get("metadata") or {}).get("continue")

        return await asyncio.to_thread(call)

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        def call() -> None:
            try:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, {"status": status}
                )
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise KubeError(
                    f"patch status {namespace}/{name}: {exc.reason}", exc.status
                ) from exc

        await asyncio.to_thread(call)

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        meta = obj["metadata"]
        now = utcnow()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{meta['name']}.", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind=KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=COMPONENT,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )

        def call() -> None:
            try:
                self.core.create_namespaced_event(meta["namespace"], event)
            except ApiException as exc:
                log.warning(
                    "could not post an event",
                    extra={"event": Event.KUBE_EVENT_FAILED, "reason": reason, "error": exc.reason},
                )

        await asyncio.to_thread(call)
