"""Domain errors that servicers raise; `services.rpc` maps them to gRPC status codes in
one place. A plain ValueError from the pure core counts as INVALID_ARGUMENT."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and one-line message for an exception raised by a servicer."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ServiceError):
        return exc.code, message
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
