"""The gateway's security layer: credentials, SASL, ACLs, TLS and the listener rule.

The server calls these; it never parses SASL messages or ACL files itself.
"""

from __future__ import annotations

from pyspark_logsource.gateway.security.acl import AclRule, Authorizer, denial_error_code
from pyspark_logsource.gateway.security.credentials import (
    CredentialStore,
    ScramCredential,
    add_user_to_file,
    remove_user_from_file,
)
from pyspark_logsource.gateway.security.errors import (
    IllegalSaslStateError,
    InvalidAclFileError,
    InvalidCredentialsFileError,
    TlsConfigError,
    UnauthenticatedRemoteListenerError,
    UnknownUserError,
    UnsupportedSaslMechanismError,
)
from pyspark_logsource.gateway.security.listener import check_listener, is_loopback
from pyspark_logsource.gateway.security.sasl import (
    PlainServer,
    SaslServer,
    ScramServer,
    mechanisms,
    new_sasl_server,
)
from pyspark_logsource.gateway.security.tls import peer_principal, server_ssl_context

__all__ = [
    "AclRule",
    "Authorizer",
    "CredentialStore",
    "IllegalSaslStateError",
    "InvalidAclFileError",
    "InvalidCredentialsFileError",
    "PlainServer",
    "SaslServer",
    "ScramCredential",
    "ScramServer",
    "TlsConfigError",
    "UnauthenticatedRemoteListenerError",
    "UnknownUserError",
    "UnsupportedSaslMechanismError",
    "add_user_to_file",
    "check_listener",
    "denial_error_code",
    "is_loopback",
    "mechanisms",
    "new_sasl_server",
    "peer_principal",
    "remove_user_from_file",
    "server_ssl_context",
]
