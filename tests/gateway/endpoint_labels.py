"""The request-level series carry ``endpoint``; tests written before chat ask about completions.

:func:`with_endpoint` fills in ``endpoint="completions"`` when a test names such a series without
saying which endpoint, so a sample is still matched on its full label set.
"""

from __future__ import annotations

ENDPOINT_SERIES = (
    "gateway_requests",
    "gateway_request_duration_seconds",
    "gateway_upstream_duration_seconds",
    "gateway_time_per_output_token_seconds",
    "gateway_time_to_first_token_seconds",
    "gateway_prompt_tokens",
    "gateway_completion_tokens",
    "gateway_requests_in_flight",
    "gateway_unsupported_parameter_rejections",
    "gateway_stream_failures",
    "gateway_client_disconnects",
)


def with_endpoint(name: str, labels: dict[str, str]) -> dict[str, str]:
    if "endpoint" in labels or not any(name == s or name.startswith(s + "_") for s in ENDPOINT_SERIES):
        return labels
    return {**labels, "endpoint": "completions"}
