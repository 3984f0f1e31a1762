"""`GET /openapi.json`: the OpenAPI 3.1 description of the endpoints the server really has.

Written by hand, as the handlers parse their bodies themselves (by the same
rules as a batch line, core/openai/): the request schemas name the fields a
client most often sends, with their ranges, and allow the rest of OpenAI's
and vLLM's fields (the server checks each and answers 400 for one it cannot
honour). Every error is declared in OpenAI's shape, for every operation.
"""

from __future__ import annotations

from fsched.core.openai.batch import MAX_METADATA_PAIRS, MAX_METADATA_VALUE

JSON = "application/json"
_ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "429", "503")


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"content": {JSON: {"schema": schema}}}


def _op(op_id: str, summary: str, ok: dict, *, body: dict | None = None, params: list | None = None,
        auth: bool = True, statuses: tuple[str, ...] = _ERROR_STATUSES, links: dict | None = None) -> dict:
    op: dict = {"operationId": op_id, "summary": summary,
                "responses": {"200": {"description": "OK", **ok, **({"links": links} if links else {})}}}
    for status in statuses:
        op["responses"][status] = {"description": "An error in OpenAI's shape", **_json(_ref("Error"))}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if params:
        op["parameters"] = params
    if not auth:
        op["security"] = []
    return op


def _links(name: str, *operations: str) -> dict:
    """The id an answer carries, as the path parameter `name` of these operations (stateful testing)."""
    return {op: {"operationId": op, "parameters": {name: "$response.body#/id"}} for op in operations}


def _path_id(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: dict) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema}


_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 128},
    "seed": {"type": ["integer", "null"]},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                       {"type": "null"}]},
    "stream": {"type": ["boolean", "null"]},
    "priority": {"type": "integer", "minimum": 0, "maximum": 9},
}
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant"]}, "content": {"type": "string"}}}

SCHEMAS = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}},
    "CompletionRequest": {"type": "object", "required": ["prompt"], "properties": {
        **_SAMPLING,
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "echo": {"type": ["boolean", "null"]}}},
    "ChatRequest": {"type": "object", "required": ["messages"], "properties": {
        **_SAMPLING, "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1}}},
    "ResponsesRequest": {"type": "object", "required": ["input"], "properties": {
        "model": {"type": "string"}, "input": {"type": "string"},
        "instructions": {"type": ["string", "null"]},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "stream": {"type": ["boolean", "null"]},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2}}},
    "BatchRequest": {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
                     "additionalProperties": False, "properties": {
        "input_file_id": {"type": "string"},
        "endpoint": {"enum": ["/v1/completions", "/v1/chat/completions"]},
        "completion_window": {"type": "string", "description": "24h, or shorter: 90s, 30m, 2h"},
        "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA_PAIRS,
                     "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE}}}},
    "Upload": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"}, "purpose": {"enum": ["batch"]}}},
    "Object": {"type": "object", "required": ["object"], "properties": {"object": {"type": "string"}}},
    "List": {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array"}, "has_more": {"type": "boolean"}}},
    "Tokenize": {"type": "object", "properties": {
        "prompt": {"type": "string"}, "messages": {"type": "array", "items": _MESSAGE},
        "return_token_strs": {"type": "boolean"}}},
    "Detokenize": {"type": "object", "required": ["tokens"], "properties": {
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}},
    "Weight": {"type": "object", "required": ["tenant", "weight"], "properties": {
        "tenant": {"type": "string"}, "weight": {"type": "number", "exclusiveMinimum": 0}}},
}

# A stream's schema is its events': server-sent events with a `data` line (and, for the Responses
# API, an `event` line), the data a JSON chunk or `[DONE]`.
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"},
                                                                  "event": {"type": "string"}}}
_STREAMED = {"content": {JSON: {"schema": _ref("Object")}, "text/event-stream": {"schema": _EVENT}}}
_OBJECT = _json(_ref("Object"))
_LIST = _json(_ref("List"))
_PAGE = [_query("after", {"type": "string"}), _query("limit", {"type": "integer"})]


def _paths() -> dict:
    body = {name: {JSON: {"schema": _ref(name)}} for name in SCHEMAS}
    return {
        "/health": {"get": _op("health", "Whether the job table can be read, and the live daemons", _json(
            {"type": "object"}), auth=False, statuses=("503",))},
        "/v1/models": {"get": _op("listModels", "The models the live daemons serve", _LIST)},
        "/v1/models/{model}": {"get": _op("getModel", "One served model", _OBJECT,
                                          params=[_path_id("model")])},
        "/v1/completions": {"post": _op("createCompletion", "A completion", _STREAMED,
                                        body=body["CompletionRequest"])},
        "/v1/chat/completions": {"post": _op("createChatCompletion", "A chat completion", _STREAMED,
                                             body=body["ChatRequest"])},
        "/v1/responses": {"post": _op("createResponse", "A response (OpenAI's Responses API, text)",
                                      _STREAMED, body=body["ResponsesRequest"])},
        "/tokenize": {"post": _op("tokenize", "A prompt's token ids (vLLM's)", _json({"type": "object"}),
                                  body=body["Tokenize"])},
        "/detokenize": {"post": _op("detokenize", "Token ids' text (vLLM's)", _json({"type": "object"}),
                                    body=body["Detokenize"])},
        "/v1/files": {
            "post": _op("uploadFile", "Upload a batch input file", _OBJECT,
                        body={"multipart/form-data": {"schema": _ref("Upload")}},
                        links=_links("file_id", "getFile", "deleteFile", "getFileContent")),
            "get": _op("listFiles", "The tenant's files, newest first", _LIST, params=[
                *_PAGE, _query("order", {"enum": ["asc", "desc"]}), _query("purpose", {"type": "string"})]),
        },
        "/v1/files/{file_id}": {
            "get": _op("getFile", "A file", _OBJECT, params=[_path_id("file_id")]),
            "delete": _op("deleteFile", "Delete a file", _OBJECT, params=[_path_id("file_id")]),
        },
        "/v1/files/{file_id}/content": {"get": _op(
            "getFileContent", "A file's bytes (an output file: its JSONL lines)",
            {"content": {"application/octet-stream": {"schema": {"type": "string"}},
                         "application/jsonl": {"schema": {"type": "string"}}}},
            params=[_path_id("file_id")], statuses=(*_ERROR_STATUSES, "410"))},
        "/v1/batches": {
            "post": _op("createBatch", "Create a batch", _OBJECT, body=body["BatchRequest"],
                        links=_links("batch_id", "getBatch", "cancelBatch")),
            "get": _op("listBatches", "The tenant's batches, newest first", _LIST, params=_PAGE),
        },
        "/v1/batches/{batch_id}": {"get": _op("getBatch", "A batch", _OBJECT, params=[_path_id("batch_id")])},
        "/v1/batches/{batch_id}/cancel": {"post": _op("cancelBatch", "Cancel a batch", _OBJECT,
                                                      params=[_path_id("batch_id")])},
        "/dashboard/api/state": {"get": _op("dashboardState", "The dashboard's figures",
                                            _json({"type": "object"}),
                                            params=[_query("since", {"type": "number"})])},
        "/dashboard/api/weights": {"post": _op("setWeight", "Set a tenant's weight (an admin key)", _json(
            {"type": "object"}), body=body["Weight"])},
    }


def openapi_document(version: str) -> dict:
    return {
        "openapi": "3.1.0",
        "info": {"title": "fsched", "version": version,
                 "description": "OpenAI-compatible API over fsched's job table; each API key is a tenant."},
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": _paths(),
    }
