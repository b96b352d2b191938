"""Settings: one pydantic-settings class, every field settable as ``HEADSCOPE_<NAME>``."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from . import paths

MAX_THREADS = 1024  # HEADSCOPE_THREADS' upper bound


class Settings(BaseSettings):
    """Server and engine configuration.

    Every field can be set through the environment with the prefix ``HEADSCOPE_``
    (``HEADSCOPE_PORT=9000``); the command line overrides the environment.
    """

    # allow_inf_nan: "inf" parses as a float and passes every lower bound, then breaks whatever
    # turns it into a number of seconds (uvicorn's grace period: an OverflowError at start-up).
    # Refused here, with the one line every other out-of-range setting gets.
    model_config = SettingsConfigDict(env_prefix="HEADSCOPE_", env_file=None, extra="ignore", allow_inf_nan=False)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="the port to listen on (0: any free one)")
    model: str = Field(
        "dinov2-s14-focus",
        description="the default model id; several ids separated by commas are all offered, the first is the default",
    )
    extra_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="more model ids to offer (timm names, 'timm:NAME', or 'local:ARCH@PATH')",
    )
    any_model: bool = Field(
        False,
        description="let the page load any pretrained timm model of a supported family on demand "
        "(downloads from the Hugging Face hub; names only, checked against timm's list)",
    )
    any_model_on_network: bool = Field(
        False,
        description="allow any_model on a non-loopback host: anyone who reaches the server can then make it "
        "download and load models (disk, memory, bandwidth); refused at start-up without it",
    )
    catalog_max_params: int = Field(
        700_000_000,
        ge=1,
        description="the most parameters a catalogue model may have to be loaded on demand (checked before "
        "any download; 422 model_too_large)",
    )
    catalog_max_bytes: int = Field(
        3 * 1024**3,
        ge=1,
        description="the largest weights file a catalogue model may download (checked before the download; "
        "422 model_too_large); the disk must also have this file's size free, plus 1 GiB",
    )
    max_loaded_models: int = Field(
        3,
        ge=1,
        description="models kept in memory at once; loading one more unloads the least recently used "
        "model other than the default (it stays offered and loads again when asked for)",
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N | mps")
    precision: Literal["fp32", "bf16", "fp16", "auto"] = Field(
        "fp32",
        description="fp32 (the default on every device: exact, TF32 off), bf16 or fp16 (autocast); "
        "auto = bf16/fp16 on CUDA, fp32 elsewhere. Every answer says its precision",
    )
    threads: int = Field(
        0,
        ge=0,
        # OpenMP aborts the process (SIGABRT, after uvicorn said it started) when asked for far
        # more threads than it can make (100000 did); 1024 is past the cores of any machine it serves on.
        le=MAX_THREADS,
        description=f"torch intra-op threads on CPU (0 = torch default; at most {MAX_THREADS})",
    )
    models_dir: Path = Field(
        default_factory=paths.default_models_dir,
        description="downloaded and converted models: models/ in a checkout, else the user's cache directory",
    )
    static_dir: Path = Field(
        default_factory=lambda: paths.asset_dir("static"), description="the page's static files (shipped in the wheel)"
    )
    templates_dir: Path = Field(
        default_factory=lambda: paths.asset_dir("templates"), description="the page's Jinja2 templates (in the wheel)"
    )
    docs_url: str = Field(
        "",
        max_length=500,
        description="the documentation site the page links to for explanations (the Why view's verdicts); "
        "empty: the site `make docs` built into the checkout's site/, served at /guide/ when it is there",
    )

    # worker
    max_batch_size: int = Field(8, ge=1, description="images per forward pass (dynamic batching) on the CPU and MPS")
    max_wait_ms: float = Field(5.0, ge=0, description="how long a batch waits for company, on the CPU and MPS")
    cuda_max_batch_size: int = Field(64, ge=1, description="images per forward pass on CUDA")
    cuda_max_wait_ms: float = Field(2.0, ge=0, description="how long a batch waits for company on CUDA")
    max_queue: int = Field(
        32, ge=1, description="uploads admitted at once (decoding, queued or computing); more get 429"
    )
    request_timeout_s: float = Field(60.0, gt=0)
    shutdown_grace_s: float = Field(20.0, ge=0)

    # input limits
    max_upload_bytes: int = Field(
        20 * 1024 * 1024,
        ge=1,
        description="the largest upload; also the largest picture file the survey and extract read "
        "(larger files are refused before being read, as file_too_large)",
    )
    max_image_pixels: int = Field(40_000_000, ge=1)
    max_aspect: float = Field(3.0, ge=1)
    resize: Literal["aspect", "square"] = "aspect"

    # admission and resource bounds (app/serving/admission.py; README "Resource limits")
    max_follow_ups: int = Field(
        16,
        ge=1,
        description="follow-up requests (cached GETs, stats, explain, output, images; with ablate or another model a "
        "forward each) admitted at once, besides uploads; more get 429",
    )
    max_heavy: int = Field(
        2,
        ge=1,
        description="heavy requests (importance, pruning, relevance, faithfulness, zero-shot) admitted at once; "
        "more get 429",
    )
    max_uploads_per_client: int | None = Field(
        None,
        ge=1,
        description="uploads one client address may have admitted at once (its share of max_queue); more get "
        "429. Default: half of max_queue (at least 2)",
    )
    max_heavy_per_client: int | None = Field(
        None,
        ge=1,
        description="heavy requests one client address may have admitted at once; more get 429. Default: the "
        "whole pool (max_heavy; each is bounded by the request timeout)",
    )
    max_tasks_per_client: int = Field(
        2,
        ge=1,
        description="long computations (importance, pruning, relevance, faithfulness; 4 of each kind at once in "
        "all) one client address may have started and running, of each kind; more get 429",
    )
    max_test_forwards: int = Field(
        256,
        ge=1,
        description="the most perturbed forwards one faithfulness test may ask for (2 x methods x non-zero "
        "fractions); more is refused with 422 task_too_large",
    )
    body_grace_s: float = Field(
        10.0, ge=0, description="an upload's body may arrive at any pace for this long; then at min_body_bytes_per_s"
    )
    min_body_bytes_per_s: float = Field(
        10_000,
        ge=0,
        description="after body_grace_s, an upload's body must have arrived at this average rate or better "
        "(bytes per second since the grace period ended); slower is refused with 408. 0: no minimum",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="addresses (or '*') of reverse proxies whose X-Forwarded-For names the client (uvicorn's "
        "forwarded_allow_ips); the per-client shares count that address. Empty (the default): the headers are "
        "ignored and the connection's peer address is the client",
    )
    max_decodes: int | None = Field(
        None,
        ge=1,
        description="pictures decoded at once (the others wait their turn). Default: 2 on the CPU and MPS "
        "(the forward needs the cores), the machine's cores on CUDA (decoding is then the limit)",
    )
    decode_budget_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1,
        description="estimated peak memory of the decodes running; a picture over it alone gets 413, "
        "one that does not fit beside the running ones when its turn comes 429 (waiting holds none of it)",
    )
    max_json_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="JSON answers estimated over this are refused (413 answer_too_large)"
    )
    large_answer_bytes: int = Field(8 * 1024 * 1024, ge=1, description="answers of this size or more are 'large'")
    max_large_answers: int = Field(4, ge=1, description="large answers being built or sent at once; more get 429")

    # HTTP (uvicorn; app/web/protocol.py)
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="request line and headers together; more is refused with 431"
    )
    header_timeout_s: float = Field(10.0, gt=0, description="a request's line and headers must arrive within this")
    keep_alive_s: int = Field(5, ge=0, description="idle keep-alive connections are closed after this")
    send_timeout_s: float = Field(
        60.0, gt=0, description="a connection whose reader takes nothing for this long while an answer waits is closed"
    )
    log_queue_records: int = Field(
        10_000,
        ge=1,
        description="log records that may wait for a log reader that stopped reading; more are dropped and counted",
    )

    # results cache
    cache_bytes: int = Field(
        1024 * 1024 * 1024,
        # Under 1 MiB not even the default model's capture fits: every follow-up would be a 404.
        ge=2**20,
        description="uploads and captures kept for follow-up queries; captures kept on a GPU count here too "
        "(at least 1 MiB)",
    )
    max_variant_bytes: int | None = Field(
        None,
        ge=1,
        description="cache bytes the ablated variants of one image may take, of each kind (its captures "
        "with heads removed, its ablated outputs; any model): past it, the least recently used of them "
        "is evicted, not other images (the newest always stays). Default: an eighth of cache_bytes",
    )
    capture_store: Literal["device", "host"] = Field(
        "device",
        description="where captures are kept: 'device' (where the forward ran, no transfer; "
        "evicted first when the GPU runs out of memory) or 'host' (copied to host memory)",
    )

    # security
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed to call the API from a browser, each named ('https://app.example'); "
        "never '*' (refused at start-up)",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="host names the server answers to besides the defaults (a Host header naming "
        "another gets 400 bad_host; against DNS rebinding): 'example.org', '*.example.org' "
        "(its sub-domains), or '*' (any: only where a proxy in front checks Host). The defaults: "
        "localhost, 127.0.0.1 and [::1] always; any IP address (no name) when bound to a "
        "non-loopback address such as 0.0.0.0; the --host name itself",
    )
    # Fault injection through the X-Headscope-Fault header: for the reliability tests only.
    enable_fault_injection: bool = False

    def batching(self, device_type: str) -> tuple[int, float]:
        """``(max_batch_size, max_wait_ms)`` for a device: GPU-sized on CUDA, else the CPU's."""
        if device_type == "cuda":
            return self.cuda_max_batch_size, self.cuda_max_wait_ms
        return self.max_batch_size, self.max_wait_ms

    def decodes(self, device_type: str) -> int:
        """:attr:`max_decodes`, or its default for a device: the cores on CUDA, else 2."""
        if self.max_decodes is not None:
            return self.max_decodes
        if device_type == "cuda":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
            return max(2, cores)
        return 2

    @model_validator(mode="after")
    def _several_models(self) -> Settings:
        """``HEADSCOPE_MODEL=a,b``: ``a`` is the default and ``b`` is offered too."""
        if "," in self.model:
            ids = [m.strip() for m in self.model.split(",") if m.strip()]
            if not ids:
                raise ValueError(f"--model / HEADSCOPE_MODEL: no model id in {self.model!r}")
            first, *rest = ids
            self.model, self.extra_models = first, [*rest, *self.extra_models]
        self.check_one_id_each()
        return self

    def check_one_id_each(self) -> None:
        """Two weights files of one name (``a/model.safetensors``, ``b/model.safetensors``) would
        share an id, and the second would be dropped unsaid: refused, with the way to name them."""
        from .zoo.ids import ModelSpec, add_distinct

        seen: dict[str, ModelSpec] = {}
        for raw in self.model_ids:
            try:
                spec = ModelSpec.parse(raw)
            except ValueError:  # a malformed id: the registry refuses it by name when serving
                continue
            try:
                add_distinct(seen, spec)
            except ValueError as e:
                raise ValueError(f"--model / HEADSCOPE_MODEL / HEADSCOPE_EXTRA_MODELS: {e}") from None

    @property
    def variant_bytes(self) -> int:
        """:attr:`max_variant_bytes`, or its default: an eighth of the cache."""
        return self.max_variant_bytes or max(1, self.cache_bytes // 8)

    @property
    def model_ids(self) -> list[str]:
        """Every configured model id, the default first."""
        return [self.model, *self.extra_models]

    def any_model_refusal(self) -> str | None:
        """Why this configuration must not serve (``any_model`` on a network address without
        ``any_model_on_network``), else None."""
        import ipaddress

        host = self.host.strip("[]").lower()
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not self.any_model or loopback or self.any_model_on_network:
            return None
        return (
            f"--any-model (HEADSCOPE_ANY_MODEL) on {self.host}, a network address, would let anyone who "
            "reaches the server make it download and load models; serve on 127.0.0.1, or say so explicitly "
            "with --any-model-on-network (HEADSCOPE_ANY_MODEL_ON_NETWORK=1)"
        )

    @property
    def uploads_per_client(self) -> int:
        """:attr:`max_uploads_per_client`, or its default: half of the upload slots (at least 2:
        a pool of 2 or 3 is one client's)."""
        return self.max_uploads_per_client or max(2, self.max_queue // 2)

    @property
    def heavy_per_client(self) -> int:
        """:attr:`max_heavy_per_client`, or its default: the whole heavy pool."""
        return self.max_heavy_per_client or self.max_heavy

    @field_validator("cors_origins")
    @classmethod
    def _no_cors_wildcard(cls, v: list[str]) -> list[str]:
        """``*`` would let a page of any site read the API's answers: refused, not quietly dropped
        (dropping it left CORS off while the operator believed it on)."""
        if "*" in v:
            raise ValueError(
                "'*' (any origin) is not allowed: list the origins that may call the API, "
                "e.g. 'https://app.example,https://other.example'"
            )
        return v

    @field_validator("extra_models", "cors_origins", "allowed_hosts", "trusted_proxies", mode="before")
    @classmethod
    def _split(cls, v):
        """Accept a JSON list or a comma-separated string (easier in shells and compose files)."""
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                import json

                try:
                    return json.loads(v)
                except json.JSONDecodeError as e:
                    raise ValueError(
                        f'not a JSON list ({e.msg.lower()} at character {e.pos}): write \'["a", "b"]\' or a,b'
                    ) from None
            if v.startswith("{"):
                raise ValueError('not a JSON list: write \'["a", "b"]\' or a,b')
            return [x.strip() for x in v.split(",") if x.strip()]
        return v


@lru_cache
def get_settings() -> Settings:
    return Settings()
