"""Pydantic response models (they are also the OpenAPI schema at /docs); the request models are
:mod:`app.serving.params`, declared once for the routes and the Python API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

# what every computing answer says it was computed in (issue #37)
Precision = Annotated[
    Literal["fp32", "bf16", "fp16"],
    Field(description="what the numbers were computed in: fp32 (exact, no TF32), or bf16/fp16 autocast"),
]


class StatsResponse(BaseModel):
    """Per-head statistics; ``[L][H]`` lists unless said otherwise."""

    model: str
    image_id: str
    tokens: Tokens
    layers: int
    heads: int
    entropy: list[list[float]] = Field(description="mean over query rows of H(row)/log N")
    entropy_cls: list[list[float]] | None = Field(description="H(CLS row)/log N")
    distance_px: list[list[float]] = Field(description="mean attention distance in input pixels")
    prefix_mass: list[list[float]] | None = Field(description="mean attention mass on prefix tokens")
    artifact_mass: list[list[float]] | None = Field(description="mean attention mass on high-norm artifact tokens")
    similarity: list[list[list[float]]] = Field(description="[L][H][H] 1 - JS/log 2 between heads")
    cls_cosine: list[list[list[float]]] | None = Field(description="[L][H][H] cosine of CLS rows")
    mass_patches: list[list[int]] | None = Field(description="patches holding mass_fraction of the CLS row")
    mass_fraction: float
    rank: dict = Field(description="numerical and effective rank of the concatenated head outputs per layer")
    artifacts: dict = Field(description="high-norm tokens of the last layer: tokens, threshold, norms")
    token_norms_last: list[float]
    input_size: list[int]
    heads_per_layer: list[int] | None = Field(
        None, description="windowed models: heads of each layer's stage (the [L][H] lists are ragged)"
    )
    stages: list[StageInfo] | None = Field(None, description="windowed models: every stage at this input")
    entropy_over: str | None = Field(None, description="windowed models: 'window' (entropy over the W*W keys)")
    unavailable: dict[str, str] | None = Field(
        None, description="windowed models: statistics that have no meaning there (null fields), with the reason"
    )
    ablated: list[list[int]] = Field(default_factory=list, description="[layer, head] pairs removed (`ablate`)")
    precision: Precision = "fp32"


class StageInfo(BaseModel):
    """One stage of a windowed model (Swin): its layers, heads, grid and windows."""

    index: int
    layers: list[int] = Field(description="first and last layer of the stage (layers are numbered across stages)")
    heads: int
    grid: list[int] = Field(description="(rows, cols) of the stage's grid")
    cell_size: list[int] = Field(description="(height, width) of a cell in input pixels")
    window: list[int] = Field(description="(rows, cols) of a window, in cells")
    windows: list[int] = Field(description="windows per column and per row (padding completes the last ones)")
    shifts: list[list[int]] = Field(description="cyclic shift (rows, cols) of each layer of the stage")
    dense: bool = Field(description="whether query=all and rollout are answered (stages of at most 2048 cells)")


class PrefixToken(BaseModel):
    index: int
    kind: Literal["cls", "dist", "reg"]


class Tokens(BaseModel):
    count: int = Field(description="N = prefix tokens + patches")
    num_prefix: int
    prefix: list[PrefixToken]
    grid: list[int] = Field(description="patch grid (rows, cols); windowed models: the stage's grid")
    patch_size: list[int] = Field(
        description="(height, width) of a patch in input pixels; windowed models: of a cell of the stage"
    )
    stage: int | None = Field(None, description="windowed models: the stage of the answer's layers")
    window: list[int] | None = Field(None, description="windowed models: (rows, cols) of the stage's windows")


class Timing(BaseModel):
    queue: float
    compute: float
    encode: float


class AttentionMeta(BaseModel):
    model: str
    image_id: str = Field(description="content hash of the upload; use it with GET /api/v1/attention/{image_id}")
    filename: str | None = None
    image_size: list[int] = Field(description="(height, width) of the decoded image")
    input_size: list[int] = Field(description="(height, width) the model saw")
    tokens: Tokens
    layers: list[int]
    heads: list[int | str] = Field(description="head indices, or ['mean'] / ['max'] / ['rollout'] when aggregated")
    query: list[int] = Field(description="the token index of each query row")
    aggregate: str
    dtype: str
    shape: list[int] = Field(description="[layers, heads, queries, tokens]")
    cached: bool = Field(description="answered from the server's cache without a forward pass")
    dropped: list[int] = Field(default_factory=list, description="key tokens zeroed by `drop`")
    temperature: float = Field(1.0, description="softmax temperature of the maps: softmax(scores / T); 1 = the model")
    ablated: list[list[int]] = Field(
        default_factory=list, description="[layer, head] pairs removed (`ablate`) before the maps were captured"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="what the numbers were computed in: fp32 (exact, no TF32), or bf16/fp16 autocast"
    )
    timing_ms: Timing
    stages: list[StageInfo] | None = Field(
        None, description="windowed models (Swin): every stage of the image; `tokens` is the answer's stage"
    )


class AttentionResponse(AttentionMeta):
    attention: list = Field(description="nested lists of shape `shape`; rows sum to 1")
    stats: dict | None = None


class ExplainSteps(BaseModel):
    """What the model's attention does beyond plain softmax(q k^T / sqrt(d)) v."""

    rope: bool = Field(description="q and k are rotated by position (RoPE) after the projections")
    relative_bias: bool = Field(description="a learned bias per relative position is added to the scores")
    qk_norm: bool = Field(description="q and k are normalised per head")
    inner_norm: bool = Field(description="a norm (or gate) sits between the concatenated heads and W_O")
    absolute_pos: bool = Field(description="position embeddings are added to the tokens before the first block")


class ExplainResponse(BaseModel):
    """One head's computation for one query token; vectors as lists, shapes in the descriptions."""

    model: str
    image_id: str
    filename: str | None = None
    image_size: list[int]
    input_size: list[int]
    tokens: Tokens
    cached: bool = Field(description="answered from the server's cache without a forward pass")
    ablated: list[list[int]] = Field(default_factory=list, description="[layer, head] pairs removed (`ablate`)")
    precision: Precision = "fp32"
    layer: int
    head: int
    query: int = Field(description="token index of the query")
    num_layers: int
    num_heads: int = Field(description="H")
    head_dim: int = Field(description="d")
    embed_dim: int = Field(description="D")
    scale: float = Field(description="the factor on q.k (1/sqrt(d))")
    key_tokens: list[int] = Field(description="the key tokens this row covers, in the order of k, v and the rows")
    steps: ExplainSteps
    shapes: dict[str, list[int]] = Field(description="shapes of X, W_Q^h, W_K^h, W_V^h (D x d), Q_h, K_h, V_h, W_O")
    q: list[float] = Field(description="[d] the query's q for this head, after any QK-norm and RoPE")
    k: list[list[float]] = Field(description="[N][d] every key token's k, same rule")
    v: list[list[float]] = Field(description="[N][d] every key token's v")
    dot: list[float] = Field(description="[N] q . k_j before the scale")
    bias: list[float] | None = Field(description="[N] what the model adds to the scores (BEiT), else null")
    scores: list[float] = Field(description="[N] pre-softmax logits: scale * q . k_j + bias_j")
    attention: list[float] = Field(description="[N] softmax(scores): the row the attention endpoint serves")
    head_output: list[float] = Field(description="[d] sum_j attention_j v_j")
    proj_input: list[float] = Field(description="[H*d] the heads' outputs concatenated: what W_O multiplies")
    head_contributions: list[list[float]] = Field(description="[H][D] W_O[:, slice of head h] @ proj_input_h")
    proj_bias: list[float] = Field(description="[D] the output projection's bias (zeros if it has none)")
    attn_output: list[float] = Field(
        description="[D] the output projection's result: sum_h head_contributions + proj_bias, before layer "
        "scale and the residual add"
    )
    timing_ms: Timing


class ModelInfo(BaseModel):
    id: str
    default: bool
    loaded: bool = Field(description="in memory now (an offered model that is not loads when asked for)")
    source: str
    on_demand: bool = Field(False, description="loaded from the catalogue by a page, not configured")
    error: str | None = None
    arch: str | None = None
    description: str | None = None
    layers: int | None = None
    heads: int | None = None
    patch_size: list[int] | None = None
    input_size: list[int] | None = None
    prefix_tokens: list[PrefixToken] | None = None
    dynamic_size: bool | None = None
    windowed: bool | None = Field(
        None, description="windowed attention (Swin): one grid per stage; known from the name before loading"
    )
    stages: list[StageInfo] | None = Field(None, description="windowed models, once loaded: stages at input_size")
    output: Literal["saliency", "classes", "embedding"] | None = Field(
        None, description="what GET /api/v1/attention/{image_id}/output returns for this model"
    )
    text: bool | None = Field(
        None,
        description="once loaded: a text tower beside the image tower (CLIP-style models: text:PHRASE targets, "
        "zero-shot)",
    )


class ModelsResponse(BaseModel):
    default: str
    models: list[ModelInfo]
    any_model: bool = Field(
        False,
        description="whether this server loads any catalogue model on demand (GET /api/v1/models/catalog)",
    )
    max_loaded_models: int | None = Field(
        None, description="models kept in memory at once; the least recently used beyond it is unloaded"
    )


class CatalogModel(BaseModel):
    name: str = Field(description="timm name with its pretrained tag, or open_clip's ARCH/PRETRAINED")
    id: str = Field(description="the model id requests use once it is loaded: timm:NAME or open_clip:ARCH/PRETRAINED")
    family: str = Field(description="vit, deit, eva, beit, swin or swinv2; clip or siglip (open_clip)")
    offered: bool = Field(description="already offered by this server (loaded, or loads from disk when asked for)")
    loaded: bool = Field(description="in memory now")
    cached: bool = Field(description="weights in the server's Hugging Face cache: loads without a download")


class CatalogResponse(BaseModel):
    query: str
    total: int = Field(description="names that match the query (the answer holds at most `limit`)")
    models: list[CatalogModel]
    note: str | None = Field(
        None, description="why a part of the catalogue is absent (open_clip without the clip extra)"
    )


class LoadError(BaseModel):
    code: str
    message: str


class LoadStatus(BaseModel):
    """A catalogue model's load: queued, downloading (bytes so far), loading (the build), ready or failed."""

    name: str
    id: str
    family: str
    state: Literal["idle", "queued", "downloading", "loading", "ready", "failed"]
    bytes_done: int = Field(description="bytes of the weights file received (or found in the cache)")
    bytes_total: int | None = Field(description="size of the weights file, once known")
    fraction: float | None = Field(description="bytes_done / bytes_total; 1 once ready")
    seconds: float = Field(description="time since the load started (until it ended)")
    error: LoadError | None = Field(description="why it failed: the code and message the API answers for it")


# -- model output, ablation, importance (issue 16) -----------------------------------------------


class ClassScore(BaseModel):
    index: int
    label: str = Field(description="ImageNet class name (first synonym) when the head has ImageNet's classes")
    description: str | None = Field(None, description="timm's full ImageNet description")
    probability: float


class ClassesOutput(BaseModel):
    top5: list[ClassScore]
    probabilities: list[float] = Field(description="the full probability vector")


class EmbeddingOutput(BaseModel):
    norm: float = Field(description="L2 norm of the pooled embedding")
    dim: int
    embedding: list[float]


class OutputChange(BaseModel):
    """How the ablated output differs from the unablated one (fields by kind)."""

    metric: str
    mean_abs_diff: float | None = Field(None, description="saliency: mean |difference| over pixels")
    max_abs_diff: float | None = None
    top1_logprob_drop: float | None = Field(None, description="classes: drop of the top class's log-probability")
    kl: float | None = Field(None, description="classes: KL(unablated || ablated) in nats")
    top1_before: ClassScore | None = None
    top1_after: ClassScore | None = None
    top1_before_probability_after: float | None = None
    top1_changed: bool | None = None
    relative_l2: float | None = Field(None, description="embedding: |e' - e| / |e|")
    norm_before: float | None = None
    norm_after: float | None = None


class OutputResponse(BaseModel):
    model: str
    image_id: str
    kind: Literal["saliency", "classes", "embedding"]
    output: list[list[float]] | ClassesOutput | EmbeddingOutput = Field(
        description="saliency: [h][w] at the model's input size, 0..1; classes: top-5 and all "
        "probabilities; embedding: the pooled embedding and its norm"
    )
    ablated: list[list[int]] = Field(description="[layer, head] pairs removed")
    ablate: str = Field(description="the same pairs as text")
    change: OutputChange | None = Field(description="with `ablate`: the change against the unablated output")
    metric: str
    metric_text: str
    input_size: list[int]
    image_size: list[int]
    note: str | None = Field(None, description="why the model's output is missing or reduced, if it is")
    cached: bool = Field(description="both outputs (ablated and unablated) came from the server's cache")
    precision: Precision = "fp32"
    timing_ms: dict[str, float]


class ImportanceResponse(BaseModel):
    model: str
    image_id: str
    method: Literal["ablation", "gradient"]
    metric: str = Field(description="what importance[l][h] measures")
    metric_text: str
    kind: Literal["saliency", "classes", "embedding"]
    layers: int
    heads: int
    importance: list[list[float]] = Field(description="[L][H]")
    kl: list[list[float]] | None = Field(None, description="classes, method=ablation: KL divergence per head")
    loss: str | None = Field(None, description="method=gradient: the loss differentiated")
    loss_value: float | None = None
    input_size: list[int]
    precision: Precision = "fp32"
    cached: bool
    timing_ms: dict[str, float]


class PruningResponse(BaseModel):
    model: str
    image_id: str
    kind: Literal["saliency", "classes", "embedding"]
    method: Literal["ablation", "gradient"] = Field(description="the importance that orders the heads")
    metric: str
    metric_text: str
    order: list[list[int]] = Field(description="[layer, head] from least to most important")
    removed: list[int] = Field(description="heads removed at each point (the first `removed[i]` of `order`)")
    change: list[float] = Field(description="output change at each point")
    kl: list[float] | None = None
    top1: list[int] | None = Field(None, description="classes: the top class at each point")
    top1_kept: list[bool] | None = None
    heads_total: int
    precision: Precision = "fp32"
    cached: bool
    timing_ms: dict[str, float]


class ProgressResponse(BaseModel):
    state: Literal["idle", "running", "done"] = Field(
        description="idle: not started (the GET starts it); running; done: cached, the GET answers at once"
    )
    task: Literal["importance", "pruning", "faithfulness"]
    stage: str | None = None
    done: float
    total: float | None
    fraction: float
    elapsed_s: float | None = None
    eta_s: float | None = None
    cancel_token: str | None = Field(
        None,
        description="in the 202 answer to the request that started the computation only: "
        "`DELETE /api/v1/tasks/{cancel_token}` gives it up",
    )


class TaskCancelResponse(BaseModel):
    state: Literal["cancelled", "running"] = Field(
        description="cancelled; or running: other requests wait for it, it goes on for them"
    )


class TextToken(BaseModel):
    """One token of a phrase and how much it matters to the image-text score."""

    token: str = Field(description="the token as the tokenizer splits the phrase")
    position: int = Field(description="its index in the model's token sequence")
    relevance: float = Field(description="its share of the phrase's relevance (the tokens sum to 1)")


class RelevanceResponse(BaseModel):
    """One relevance map: how much each patch contributes to one scalar of the output."""

    model: str
    image_id: str
    kind: Literal["saliency", "classes", "embedding"] = Field(description="the model's output kind")
    method: Literal["chefer", "grad_attention", "rollout", "attention", "random", "chefer2021", "attnlrp", "legrad"]
    method_text: str = Field(description="the method's definition in one line")
    target: str = Field(description="the target explained, normalised (`output`, `box:X0,Y0,X1,Y1`, ...)")
    y: float = Field(description="the target's value for this picture")
    class_index: int | None = Field(description="classes: the class whose logit y is")
    class_label: str | None = Field(description="its ImageNet name, where the head has ImageNet's classes")
    relevance: list[list[float]] = Field(description="[rows][cols] on the patch grid, summing to 1")
    grid: list[int] = Field(description="(rows, cols) of the patch grid")
    patch_size: list[int]
    input_size: list[int]
    image_size: list[int]
    rows: Literal["cls", "mean"] = Field(
        description="rollout and attention read the CLS row (`cls`), or the mean over all rows for models "
        "without a CLS token (`mean`)"
    )
    seed: int | None = Field(description="method=random: the seed of the map")
    start_layer: int | None = Field(
        None, description="method=chefer2021: the layer its rollout starts at (`start_layer`, default 1); else null"
    )
    uniform: bool = Field(description="the map was zero everywhere and is answered as the uniform map")
    text_tokens: list[TextToken] | None = Field(
        None,
        description="target=text:PHRASE: each of the phrase's tokens with its relevance (Chefer et al. 2021's "
        "bi-modal rule on the text tower, summing to 1); null for other targets",
    )
    shape: list[int]
    dtype: str
    ablated: list[list[int]] = Field(description="[layer, head] pairs removed (`ablate`)")
    ablate: str
    cached: bool = Field(
        description="the maps came from the server's cache (every method of the target is computed at once)"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="what the numbers were computed in: fp32 (exact, no TF32), or bf16/fp16 autocast"
    )
    timing_ms: dict[str, float]


class ZeroShotLabel(BaseModel):
    label: str
    index: int = Field(description="its place in the request's list")
    logit: float = Field(description="the model's score: exp(logit_scale) x cosine (+ logit_bias for SigLIP)")
    probability: float = Field(description="CLIP: softmax over the labels; SigLIP: sigmoid of the logit")
    relevance: list[list[float]] | None = Field(None, description="maps=true: [rows][cols], summing to 1")
    text_tokens: list[TextToken] | None = Field(None, description="maps=true: the label's tokens' relevance")


class ZeroShotResponse(BaseModel):
    """Zero-shot classification over the request's labels, ranked by probability."""

    model: str
    image_id: str
    rule: Literal["softmax", "sigmoid"] = Field(description="how the logits become probabilities")
    logit_scale: float = Field(description="exp(logit_scale) of the model")
    logit_bias: float | None = Field(description="SigLIP's bias (null for CLIP)")
    labels: list[ZeroShotLabel] = Field(description="by probability, highest first")
    method: str | None = Field(description="maps=true: the relevance method of the maps")
    grid: list[int] | None = Field(description="maps=true: (rows, cols) of the maps")
    input_size: list[int]
    precision: Precision = "fp32"
    timing_ms: dict[str, float]


class FaithfulnessCurves(BaseModel):
    positive: list[float | None] = Field(
        description="protocol=live: score(most relevant patches removed) / score0 at each fraction (see `score`); "
        "protocol=paper: 1 where the top-1 prediction is still the target's class, else 0; lower is better "
        "(null when score0 = 0)"
    )
    negative: list[float | None] = Field(description="the same with the least relevant removed first: higher is better")
    auc_positive: float | None = Field(
        description="trapezoid area under `positive`; live: (0, 1) included; paper: (0, score0) included, times 100 "
        "(percent, the paper's units)"
    )
    auc_negative: float | None
    removed: list[int] = Field(
        description="removed at each fraction: live, patches (floor(f x patches)); paper, pixels (int(f x pixels))"
    )


class FaithfulnessVerdict(BaseModel):
    verdict: Literal["both", "positive", "negative", "neither", "baseline", "untested", "undefined"] = Field(
        description="better than the random map on both curves, on the positive or the negative one only, on "
        "neither; `baseline` for random itself, `untested` without a random map, `undefined` where y = 0 or the "
        "target is a class the model gives less than 1/classes (a uniform guess)"
    )
    margin_positive: float | None = Field(description="AUC+(random) - AUC+(method): above 0 is better")
    margin_negative: float | None = Field(description="AUC-(method) - AUC-(random): above 0 is better")
    max_ratio: float | None = Field(description="the highest point of the method's two curves")
    above_one: bool = Field(description="a curve rose above 1: removing patches raised the target")
    text: str = Field(description="the verdict in words, with the margins (what the page shows)")


class FaithfulnessResponse(BaseModel):
    """The perturbation test of several relevance maps on one picture, for one target."""

    model: str
    image_id: str
    kind: Literal["saliency", "classes", "embedding"]
    target: str
    y: float = Field(description="the target's unperturbed value")
    protocol: Literal["live", "paper"] = Field(description="the perturbation protocol the curves follow")
    score: Literal["probability", "target", "top1"] = Field(
        description="what the curves measure: `probability` (live, class targets: the class's softmax probability, "
        "positive whatever the logit's sign), `target` (live: y itself, saliency means and the embedding target) "
        "or `top1` (paper: 1 while the top-1 class is the target's class, else 0)"
    )
    score0: float = Field(
        description="the score of the unperturbed picture: live, every curve's denominator; paper, the curve at x = 0"
    )
    class_index: int | None
    class_label: str | None
    fractions: list[float]
    methods: dict[str, FaithfulnessCurves] = Field(description="by method, in the order of the request")
    verdicts: dict[str, FaithfulnessVerdict] = Field(
        description="by method, in the same order: each one against the random map (docs: relevance.md, "
        "Reading the verdict)"
    )
    method_text: dict[str, str]
    num_patches: int
    grid: list[int]
    patch_size: list[int]
    input_size: list[int]
    image_size: list[int]
    rows: Literal["cls", "mean"]
    forwards: int = Field(description="forwards the test ran (the unperturbed picture included)")
    batch_size: int
    text_tokens: list[TextToken] | None = Field(None, description="target=text:PHRASE: the phrase's tokens' relevance")
    seed: int | None = Field(description="the random map's seed, when `random` is tested")
    start_layer: int | None = Field(
        None, description="the layer chefer2021's rollout starts at, when `chefer2021` is tested; else null"
    )
    ablated: list[list[int]]
    ablate: str
    cached: bool
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="what the numbers were computed in: fp32 (exact, no TF32), or bf16/fp16 autocast"
    )
    timing_ms: dict[str, float]


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str


class ErrorBody(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody, "description": d}
    for s, d in {
        400: "malformed multipart body",
        403: "a feature this server has switched off (any_model_off)",
        404: "unknown model, or image no longer cached",
        408: "the request's headers or body did not arrive in time",
        413: "upload, image or answer too large (answer_too_large: ask for a binary format or less)",
        415: "not an image / unsupported format",
        422: "bad selection or parameters",
        429: "queue full (see Retry-After)",
        431: "request line and headers too large",
        503: "model not ready / out of memory / hub unreachable",
        504: "deadline exceeded",
    }.items()
}

# What the HTTP layer may answer any request before a route sees it (app/web/protocol.py, the
# AllowedHosts middleware): every operation documents these (FastAPI(responses=...)).
TRANSPORT_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "a Host this server does not answer (bad_host), or a malformed request"},
    408: ERROR_RESPONSES[408],
    # Every route (create_app's declared_query_only, the SingleParams middleware).
    422: {
        "model": ErrorBody,
        "description": "a query parameter the route does not take (invalid_parameter) or one given twice "
        "(duplicate_parameter)",
    },
    431: ERROR_RESPONSES[431],
}
