"""TLS: server and channel credentials from PEM files (plaintext when none are configured)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class TLSFiles:
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None   # server side: require client certs (mTLS)
    ca: str | None = None          # client side: verify servers with this CA

    @property
    def server_enabled(self) -> bool:
        return bool(self.cert and self.key)

    def server_credentials(self) -> grpc.ServerCredentials:
        key, cert = _read(self.key), _read(self.cert)
        ca = _read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.ca or self.server_enabled):
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None,
            private_key=_read(self.key) if self.key else None,
            certificate_chain=_read(self.cert) if self.cert else None,
        )


def _read(path: str | None) -> bytes:
    with open(path, "rb") as fh:  # type: ignore[arg-type]
        return fh.read()
