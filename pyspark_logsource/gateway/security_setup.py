"""The gateway's credentials and authorizer, from its settings."""

from __future__ import annotations

from typing import Any

from .config import GatewayConfig


class AllowAll:
    """The authorizer of a gateway without an ACL file: every principal may do everything."""

    def allowed(self, principal: str, resource: str, name: str, operation: str) -> bool:
        """Every operation on every resource is allowed."""
        return True

    def allowed_on_any(self, principal: str, resource: str, operation: str) -> bool:
        """Every operation on every resource type is allowed."""
        return True


def load_security(config: GatewayConfig) -> tuple[Any, Any]:
    """(credential store or None, authorizer) for a gateway's settings."""
    credentials = None
    if config.users_file is not None:
        from .security.credentials import CredentialStore

        credentials = CredentialStore.load(config.users_file)
    authorizer: Any = AllowAll()
    if config.acls_file is not None:
        from .security.acl import Authorizer

        authorizer = Authorizer.load(config.acls_file)
    return credentials, authorizer
