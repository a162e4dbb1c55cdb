"""Errors a request ends with, as the client should see them: an HTTP status code and a message. Raised below the
HTTP layer too (the TokenizerManager); the server answers each in the shape of the request's API
(radixlm.runtime.server.errors)."""
from __future__ import annotations


class ApiError(Exception):
    """A request's failure with the status code the client gets (the message is str(error))."""

    status_code = 500
