"""The admin API described as OpenAPI 3.1 (``/openapi.json``)."""

from __future__ import annotations

from typing import Any


def _get(summary: str, schema: dict[str, Any], *params: dict[str, Any]) -> dict[str, Any]:
    content_type = "text/plain" if schema.get("type") == "string" else "application/json"
    return {
        "get": {
            "summary": summary,
            "parameters": list(params),
            "responses": {
                "200": {"description": "OK", "content": {content_type: {"schema": schema}}},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "404": {"$ref": "#/components/responses/Error"},
                "504": {"$ref": "#/components/responses/Error"},
            },
        }
    }


_HTML = {"description": "HTML"}
_REF = {
    "name": "ref",
    "in": "path",
    "required": True,
    "description": "a reference from a node's children (URL-encoded): root, host:..., proc:..., "
    "actor:...",
    "schema": {"type": "string"},
}


def openapi() -> dict[str, Any]:
    obj = {"type": "object"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Monarch admin API",
            "version": "1",
            "description": "A live job's hosts, procs, actors and Python stacks. Start at "
            "/v1/root and follow children; every request carries the token the server "
            "printed (Authorization: Bearer TOKEN, or ?token=TOKEN).",
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "query": {"type": "apiKey", "in": "query", "name": "token"},
            },
            "responses": {
                "Error": {
                    "description": "what went wrong",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"error": {"type": "string"}},
                            }
                        }
                    },
                }
            },
            "schemas": {
                "NodePayload": {
                    "type": "object",
                    "properties": {
                        "identity": {"type": "string"},
                        "properties": {
                            "type": "object",
                            "description": "kind (root, host, proc, actor) and its fields",
                        },
                        "children": {"type": "array", "items": {"type": "string"}},
                        "parent": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "security": [{"bearer": []}, {"query": []}],
        "paths": {
            "/": {"get": {"summary": "the dashboard page", "responses": {"200": _HTML}}},
            "/v1/root": _get("the root node", {"$ref": "#/components/schemas/NodePayload"}),
            "/v1/tree": _get("the job as a text tree", {"type": "string"}),
            "/v1/snapshot": _get(
                "the whole job: hosts, their procs (state, CPU, RSS), the procs' actors "
                "(state, error, messages handled and per second, queue depth, endpoint "
                "running and for how long)",
                obj,
            ),
            "/v1/stacks/{ref}": _get(
                "a proc's Python stacks (py-spy when installed, else its own dump); "
                "504 when it does not answer",
                obj,
                _REF,
                {
                    "name": "source",
                    "in": "query",
                    "schema": {"type": "string", "enum": ["auto", "py-spy", "self"]},
                },
            ),
            "/v1/query": _get(
                "SQL over the job's telemetry tables (when enabled)",
                obj,
                {"name": "sql", "in": "query", "required": True, "schema": {"type": "string"}},
            ),
            "/v1/profile": _get(
                "every live proc sampled by py-spy (torch=1: and the torch profiler) for some "
                "seconds: a Chrome trace (with the job's timeline), flame graph stacks, notes",
                obj,
                {"name": "seconds", "in": "query", "schema": {"type": "number"}},
                {"name": "rate", "in": "query", "schema": {"type": "integer"}},
                {"name": "idle", "in": "query", "schema": {"type": "boolean"}},
                {"name": "torch", "in": "query", "schema": {"type": "boolean"}},
            ),
            "/v1/profile/last": _get(
                "what the last /v1/profile answered (404 before the first): the trace to open "
                "in ui.perfetto.dev, linked from the dashboard",
                obj,
            ),
            "/v1/trace": _get(
                "the job's timeline from its telemetry tables (Chrome trace-event JSON)", obj
            ),
            "/v1/{ref}": _get(
                "a node: host, proc or actor", {"$ref": "#/components/schemas/NodePayload"}, _REF
            ),
        },
    }
