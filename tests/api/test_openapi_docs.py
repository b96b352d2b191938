"""The API documents itself (issue 30): every parameter of every endpoint in /openapi.json has a
type, its allowed values (an enum where the set is closed), a default where it is optional and a
sentence; /docs and /redoc load nothing from another host. Against the real server.
"""

from __future__ import annotations

import re

import httpx
import pytest

from helpers.server import HTTP_TIMEOUT, SAMPLES

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}
BOGUS = "zz-not-a-value"
# pydantic's words for a value outside a closed set (Literal / Enum)
CLOSED_SET_ERROR = re.compile(r"Input should be '[^']*'(, '[^']*')* or '[^']*'")


@pytest.fixture(scope="module")
def spec(base_url) -> dict:
    return httpx.get(base_url + "/openapi.json", timeout=HTTP_TIMEOUT).json()


def parameters(spec: dict) -> list[tuple[str, str, str, str, dict, bool]]:
    """(METHOD, path, where, name, schema with the parameter's description, required) of every parameter
    and every multipart form field."""
    out = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            for p in op.get("parameters", []):
                schema = {**p.get("schema", {}), "description": p.get("description") or ""}
                out.append((method.upper(), path, p["in"], p["name"], schema, bool(p.get("required"))))
            for content in op.get("requestBody", {}).get("content", {}).values():
                form = content.get("schema", {})
                for name, schema in form.get("properties", {}).items():
                    out.append((method.upper(), path, "form", name, schema, name in form.get("required", [])))
    return out


def types_of(schema: dict) -> set[str]:
    if "type" in schema:
        return {schema["type"]}
    return {t for s in schema.get("anyOf", []) for t in types_of(s)}


def enum_of(schema: dict) -> list | None:
    """The schema's closed set, at its top or in its non-null branch (``str | None``)."""
    if "enum" in schema:
        return schema["enum"]
    return next((s["enum"] for s in schema.get("anyOf", []) if "enum" in s), None)


def test_every_parameter_has_a_type_a_default_and_a_sentence(spec):
    params = parameters(spec)
    assert len(params) > 60  # the walk found the parameters (the attention form alone has 15)
    missing = []
    for method, path, where, name, schema, required in params:
        where_ = f"{method} {path} {where}:{name}"
        desc = schema.get("description", "")
        if len(desc.split()) < 3:
            missing.append(f"{where_}: no description")
        if not types_of(schema) - {"null"}:
            missing.append(f"{where_}: no type")
        if not required and "default" not in schema and "default" not in desc:
            missing.append(f"{where_}: optional without a default (in the schema, or said in the description)")
    assert not missing, "\n".join(missing)


def test_the_upload_form_is_typed_like_the_query(spec):
    form = spec["paths"]["/api/v1/attention"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    query = {p["name"]: p for p in spec["paths"]["/api/v1/attention/{image_id}"]["get"]["parameters"]}
    for name, schema in form["properties"].items():
        if name == "image":
            continue
        q = query[name]
        assert enum_of(schema) == enum_of(q["schema"]), name
        assert types_of(schema) == types_of(q["schema"]), name
        assert schema.get("default") == q["schema"].get("default"), name
    assert form["properties"]["format"]["enum"] == ["json", "safetensors", "npy"]
    assert form["properties"]["dtype"]["enum"] == ["float32", "float16"]
    assert form["properties"]["stats"]["type"] == "boolean"


def test_no_closed_set_without_an_enum(spec, base_url):
    """Ask every string parameter without an enum for a value it cannot have: the server must not
    answer with a list of the allowed ones (that set belongs in the schema as an enum)."""
    image_id = "0" * 24  # well formed, not cached: query validation runs before the route looks it up
    undocumented = []
    with httpx.Client(base_url=base_url, timeout=HTTP_TIMEOUT) as client:
        for method, path, where, name, schema, _ in parameters(spec):
            if where not in ("query", "form") or enum_of(schema) is not None or "string" not in types_of(schema):
                continue
            url = path.replace("{image_id}", image_id).replace("{name}", "test_vit.r160_in1k")
            if where == "query":
                r = client.request(method, url, params={name: BOGUS})
            else:
                with open(SAMPLES / "cat.png", "rb") as f:
                    r = client.post(url, files={"image": ("cat.png", f, "image/png")}, data={name: BOGUS})
            message = (
                r.json().get("error", {}).get("message", "")
                if r.headers.get("content-type", "").startswith("application/json")
                else ""
            )
            if CLOSED_SET_ERROR.search(message):
                undocumented.append(f"{method} {path} {name}: {message}")
    assert not undocumented, "\n".join(undocumented)


def test_number_bounds_use_json_schemas_words(spec):
    """Pydantic wrote the bounds of its validated numbers (``Int``, ``Float``) as ``ge``/``le``,
    which JSON Schema does not know (Swagger UI and client generators ignored them): every bound
    is ``minimum``, ``maximum``, ``exclusiveMinimum`` or ``exclusiveMaximum``."""
    numbers = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                numbers.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    assert numbers and [n for n in numbers if {"ge", "le", "gt", "lt"} & set(n)] == []
    by_name = {(path, name): schema for _, path, _, name, schema, _ in parameters(spec)}
    start = by_name[("/api/v1/attention/{image_id}", "rollout_start")]
    assert {"type": "integer", "minimum": -1000, "maximum": 1000}.items() <= start["anyOf"][0].items()
    assert by_name[("/api/v1/attention/{image_id}", "temperature")]["exclusiveMinimum"] == 0
    assert by_name[("/api/v1/attention/{image_id}/stats", "mass")]["maximum"] == 1


def test_the_protocol_is_an_enum_of_the_engines_names(spec):
    """The faithfulness protocol is parsed by the engine (422 bad_protocol with its words), yet
    generated clients see its names as an enum beside null."""
    from headscope.engine.faithfulness import PROTOCOLS

    for path in ("/api/v1/attention/{image_id}/faithfulness", "/api/v1/attention/{image_id}/faithfulness/progress"):
        (schema,) = [p["schema"] for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "protocol"]
        assert enum_of(schema) == list(PROTOCOLS) == ["live", "paper"], path
        assert "null" in types_of(schema) and schema["default"] == "live"


def test_the_relevance_method_is_an_enum_of_the_engines_names(spec):
    """A map's method is parsed by the engine (422 bad_method, as in Python), yet generated clients
    see the names as an enum."""
    from headscope.engine.relevance import METHODS
    from headscope.engine.text_relevance import TEXT_METHODS

    for path in ("/api/v1/attention/{image_id}/relevance", "/api/v1/attention/{image_id}/zero-shot"):
        (schema,) = [p["schema"] for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "method"]
        assert enum_of(schema) == list(METHODS + TEXT_METHODS), path
        assert schema["default"] == "chefer"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_nothing_from_another_host(base_url, page):
    html = httpx.get(base_url + page, timeout=HTTP_TIMEOUT).text
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(r.startswith("/") for r in refs), refs
    assert "http://" not in html and "https://" not in html
    for ref in refs:
        if ref.endswith(".js"):
            body = httpx.get(base_url + ref, timeout=HTTP_TIMEOUT)
            assert body.status_code == 200, ref
            assert b"cdn.redoc.ly" not in body.content, f"{ref} still loads Redocly's logo from their CDN"
