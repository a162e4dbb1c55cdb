"""The OpenAPI document. Routes parse their own JSON bodies (each API answers errors in its own shape), so
FastAPI cannot see their request models: a route passes `openapi_extra=request_body(Model)`, and
`install_openapi` moves the models' schemas into the document's components."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

import radixlm

_REF = "#/components/schemas/{model}"


def request_body(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema(ref_template=_REF)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title="radixlm", version=radixlm.__version__, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for ops in doc["paths"].values():
            for op in ops.values():
                content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
                schema = content.get("schema", {})
                if "$ref" in schema or "title" not in schema:
                    continue
                components.update(schema.get("$defs", {}))
                components[schema["title"]] = {k: v for k, v in schema.items() if k != "$defs"}
                content["schema"] = {"$ref": _REF.format(model=schema["title"])}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
