"""Expert streaming (docs/STREAMING.md): routed experts reached only through a fetch hook, into an
expert cache in the arena. Placement changes speed, never results: every cache size and policy gives
the bits of the fully resident image, on the hosted runtime and on bare-metal boards."""
from __future__ import annotations

import ctypes as C
import os

import numpy as np
import pytest

from capi import FETCH, FETCH_WAIT, PREFETCH, STATUS, TRACE, Context, Lib, Options
from conftest import board_name, make_family_checkpoint, with_rtos
from test_families import FAMILIES
from colibri.flash import run_on_board
from colibri.image import build_image, expert_cache_bytes, read_image
from colibri.checkpoint import load_checkpoint
from colibri.pack import convert_tensors
from colibri.protocol import Sampling
from colibri.quant import DType
from colibri.reference import Reference

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def lib(hosted_build):
    return Lib(hosted_build / "libcolibri.so")


class SlowMemory:
    """The expert part behind a fetch hook, like external flash: it copies from the image bytes, and
    can be told to fail the n-th fetch or to corrupt a byte of it."""

    def __init__(self, image: bytes):
        self.buf = C.create_string_buffer(image, len(image))
        self.size = len(image)
        self.calls, self.fail_at, self.corrupt_at = 0, -1, -1
        self.offsets: list[int] = []
        self.hook = FETCH(self.fetch)

    def fetch(self, user, offset: int, n: int, dst) -> int:
        self.calls += 1
        self.offsets.append(offset)
        if self.calls == self.fail_at or offset + n > self.size:
            return 1
        C.memmove(dst, C.addressof(self.buf) + offset, n)
        if self.calls == self.corrupt_at:
            C.cast(dst, C.POINTER(C.c_uint8))[n // 2] ^= 0x10
        return 0


def streamed(lib: Lib, image: bytes, slots: int, prefetch: bool, memory: SlowMemory | None = None) -> Context:
    """A context that sees only the resident part, with `slots` cache slots."""
    memory = memory or SlowMemory(image)
    opts = Options(expert_cache=slots, expert_policy=PREFETCH if prefetch else 0, fetch=memory.hook)
    ctx = Context(lib, image, options=opts, visible=read_image(image).resident_bytes)
    ctx.memory = memory
    return ctx


def crc_entries(img) -> int:
    """The expert CRC table's entries, which an expert cache holds a copy of."""
    return img.dims.n_layers * img.dims.n_experts


def logits_after_each(ctx: Context, tokens: list[int]) -> np.ndarray:
    rows = []
    for t in tokens:
        assert ctx.feed([t]) == 0
        rows.append(ctx.logits())
    return np.stack(rows)


@pytest.fixture(scope="module")
def streaming_images(checkpoints, tmp_path_factory) -> dict[str, bytes]:
    """f32 and Q8_0 images (a block's scales travel with it), and one with two experts pinned resident."""
    out = {}
    for name in ("base", "top3_gqa4_tied"):
        ckpt = load_checkpoint(checkpoints[name], 24)
        out[name] = build_image(ckpt.dims, ckpt.tensors)
    ckpt = load_checkpoint(checkpoints["base"], 24)
    q8 = convert_tensors(ckpt.tensors, DType.Q8_0, [])
    out["base-q8_0"] = build_image(ckpt.dims, q8, expert_align=4096)
    out["base-pinned"] = build_image(ckpt.dims, q8, pinned=frozenset({(0, 1), (1, 2)}))
    # the newer families' routing (grouped sigmoid with a bias; gpt-oss's top-k softmax, whose expert biases
    # stay resident while the matrices stream; Gemma 4's experts beside a dense MLP, routed on their own norm)
    # through the cache and its one-layer-ahead prefetch
    base = tmp_path_factory.mktemp("stream_families")
    for name in ("deepseek_v3", "gpt_oss", "gemma4"):
        arch, cfg = next((a, c) for n, a, c in FAMILIES if n == name)
        ckpt = load_checkpoint(make_family_checkpoint(arch, cfg, 40, base / name), 24)
        out[name] = build_image(ckpt.dims, convert_tensors(ckpt.tensors, DType.Q8_0, []))
    return out


@pytest.mark.parametrize("name", ["base", "top3_gqa4_tied", "base-q8_0", "base-pinned", "deepseek_v3", "gpt_oss",
                                  "gemma4"])
def test_every_cache_size_and_policy_gives_the_resident_bits(lib, streaming_images, name):
    image = streaming_images[name]
    img = read_image(image)
    resident = Context(lib, image)
    assert resident.open_status == 0
    want = logits_after_each(resident, PROMPT)
    streamed_experts = img.streamed_experts()
    routed = len(PROMPT) * sum(img.dims.moe_layers) * img.dims.top_k
    for slots in sorted({img.dims.top_k, img.dims.top_k + 1, len(streamed_experts)}):
        for prefetch in (False, True):
            ctx = streamed(lib, image, slots, prefetch)
            assert ctx.open_status == 0, (slots, prefetch)
            got = logits_after_each(ctx, PROMPT)
            assert got.tobytes() == want.tobytes(), f"{name}: {slots} slots, prefetch {prefetch}"
            s = ctx.stats()
            assert s.expert_hits + s.expert_misses == routed
            # the runtime read the expert part only through the hook, and only streamed blocks
            blocks = {img.expert_block(*le)[0] for le in streamed_experts}
            assert ctx.memory.offsets and set(ctx.memory.offsets) <= blocks
            assert s.expert_bytes_fetched == sum(dict(img.expert_block(*le) for le in streamed_experts)[o]
                                                 for o in ctx.memory.offsets)
            if slots == len(streamed_experts):  # every expert fits: each is fetched at most once
                assert len(ctx.memory.offsets) == len(set(ctx.memory.offsets))
            if not prefetch:
                assert s.prefetch_issued == 0 and s.expert_misses == ctx.memory.calls


def test_the_arena_is_the_plan_plus_the_cache(lib, streaming_images):
    image = streaming_images["base-q8_0"]
    img = read_image(image)
    ctx = streamed(lib, image, 3, True)
    assert ctx.open_status == 0
    info = ctx.info
    assert info.resident_bytes == img.resident_bytes < len(image)
    assert info.expert_block_bytes == img.expert_block_bytes
    assert info.streamed_experts == len(img.streamed_experts()) == img.dims.n_layers * img.dims.n_experts
    assert ctx.needed == info.arena_bytes + expert_cache_bytes(img.expert_block_bytes, 3, crc_entries(img))
    assert lib.so.colibri_expert_cache_bytes(C.byref(info), 3) == expert_cache_bytes(img.expert_block_bytes, 3, crc_entries(img))
    assert ctx.stats().arena_bytes == ctx.needed
    # one byte less than the plan plus the cache is refused, with the exact figure
    short = Context(lib, image, arena_bytes=ctx.needed - 1, options=ctx.options, visible=img.resident_bytes)
    assert (short.open_status, short.needed) == (STATUS["E_ARENA_TOO_SMALL"], ctx.needed)


def test_cache_limits_are_named(lib, streaming_images):
    image = streaming_images["base"]
    img = read_image(image)
    small = streamed(lib, image, img.dims.top_k - 1, False)
    assert small.open_status == STATUS["E_CACHE_TOO_SMALL"]
    assert small.needed == small.info.arena_bytes + expert_cache_bytes(img.expert_block_bytes, img.dims.top_k, crc_entries(img))
    too_many = streamed(lib, image, len(img.streamed_experts()) + 1, False)
    assert too_many.open_status == STATUS["E_BAD_ARG"]
    no_hook = Context(lib, image, options=Options(expert_cache=2), visible=img.resident_bytes)
    assert no_hook.open_status == STATUS["E_NULL"]
    # without a cache the whole image must be there: the resident part alone is a truncated image
    assert Context(lib, image, visible=img.resident_bytes).open_status == STATUS["E_IMAGE_TRUNCATED"]


@pytest.mark.parametrize("fault,status", [("fail_at", "E_FETCH"), ("corrupt_at", "E_EXPERT_CRC")])
def test_a_failed_or_corrupt_fetch_stops_with_a_status_and_reset_recovers(lib, streaming_images, fault, status):
    image = streaming_images["base-q8_0"]
    want = logits_after_each(Context(lib, image), PROMPT)
    memory = SlowMemory(image)
    setattr(memory, fault, 3)
    ctx = streamed(lib, image, 2, True, memory)
    assert ctx.open_status == 0
    statuses = [ctx.feed([t]) for t in PROMPT]
    assert STATUS[status] in statuses, statuses
    assert ctx.lib.so.colibri_reset(ctx.ctx) == 0
    assert logits_after_each(ctx, PROMPT).tobytes() == want.tobytes()  # the fault is gone: same bits


class FailingGuesses:
    """Slow memory, synchronous or asynchronous, that fails every prefetch guess and serves every other fetch.
    A guess is a fetch of a block of the layer after the one running (the trace hook says when a layer is
    done: a prefetch for layer l + 1 is issued inside layer l). `how`: "fetch" (the blocking hook fails),
    "start" (fetch_start fails: a synchronous failure of the asynchronous pair) or "wait" (fetch_start
    succeeds, fetch_wait fails later: an asynchronous failure)."""

    def __init__(self, image: bytes, how: str):
        self.memory, self.how = SlowMemory(image), how
        self.layer_of = {}
        img = read_image(image)
        for layer, expert in img.streamed_experts():
            self.layer_of[img.expert_block(layer, expert)[0]] = layer
        self.n_layers = img.dims.n_layers
        self.running, self.failed, self.refetched = 0, [], []
        self.pending: dict[int, bool] = {}  # destination -> whether its fetch is to fail at the wait
        self.trace = TRACE(self.layer_done)
        self.hooks = dict(fetch=FETCH(self.fetch), fetch_start=FETCH(self.start), fetch_wait=FETCH_WAIT(self.wait))

    def layer_done(self, user, t) -> None:
        self.running = (t[0].layer + 1) % self.n_layers

    def guess(self, offset: int) -> bool:
        is_guess = self.layer_of[offset] != self.running
        if is_guess:
            self.failed.append(offset)
        elif offset in self.failed:
            self.refetched.append(offset)
        return is_guess

    def fetch(self, user, offset, n, dst) -> int:
        return 1 if self.guess(offset) else self.memory.fetch(user, offset, n, dst)

    def start(self, user, offset, n, dst) -> int:
        fail = self.guess(offset)
        if fail and self.how == "start":
            return 1
        self.pending[dst] = fail
        return 0 if fail else self.memory.fetch(user, offset, n, dst)

    def wait(self, user, dst) -> int:
        return 1 if self.pending.pop(dst) else 0

    def options(self, slots: int) -> Options:
        hooks = self.hooks if self.how != "fetch" else dict(fetch=self.hooks["fetch"])
        return Options(expert_cache=slots, expert_policy=PREFETCH, trace=C.cast(self.trace, C.c_void_p), **hooks)


@pytest.mark.parametrize("how", ["fetch", "start", "wait"])
def test_a_guess_that_fails_its_fetch_never_fails_the_feed(lib, streaming_images, how):
    """One rule for a prefetch guess whose fetch fails, whether the hook says so at once (the blocking fetch,
    or fetch_start) or only when waited for (fetch_wait): the guess is dropped, the feed goes on, and the block
    is fetched again if the router then chooses it. The logits are the resident image's bits."""
    image = streaming_images["base-q8_0"]
    want = logits_after_each(Context(lib, image), PROMPT)
    memory = FailingGuesses(image, how)
    opts = memory.options(slots=4)
    if how != "fetch":
        opts.fetch = memory.hooks["fetch"]  # required beside the asynchronous pair; the pair is used
    ctx = Context(lib, image, options=opts, visible=read_image(image).resident_bytes)
    assert ctx.open_status == 0
    assert logits_after_each(ctx, PROMPT).tobytes() == want.tobytes()
    assert memory.failed and memory.refetched  # guesses failed, and some were chosen and fetched again
    s = ctx.stats()
    assert s.prefetch_used == 0  # no failed guess served a layer


def test_the_expert_crc_table_is_read_once_at_open(lib, streaming_images):
    """Each fetched block is checked against its CRC from the table as open read it (into the arena, beside the
    slots), never from the live image: a table rewritten after open (every entry wrong) changes nothing, the
    blocks are accepted and the logits are the resident image's bits; a block corrupted in slow memory is still
    refused."""
    image = streaming_images["base-q8_0"]
    img = read_image(image)
    want = logits_after_each(Context(lib, image), PROMPT)
    ctx = streamed(lib, image, img.dims.top_k, False)
    assert ctx.open_status == 0
    table = img.header["expert_crc_offset"]
    n = 4 * img.dims.n_layers * img.dims.n_experts
    C.memmove(ctx.image.addr + table, bytes(b ^ 0x5A for b in image[table:table + n]), n)
    assert logits_after_each(ctx, PROMPT).tobytes() == want.tobytes()
    assert ctx.memory.calls > 0
    memory = SlowMemory(image)
    memory.corrupt_at = 1
    corrupt = streamed(lib, image, img.dims.top_k, False, memory)
    assert corrupt.feed([PROMPT[0]]) == STATUS["E_EXPERT_CRC"]


def test_pinned_experts_are_never_fetched(lib, streaming_images):
    image = streaming_images["base-pinned"]
    img = read_image(image)
    pinned = [(0, 1), (1, 2)]
    for le in pinned:
        assert img.expert_block(*le)[0] < img.resident_bytes
    ctx = streamed(lib, image, 2, False)
    logits_after_each(ctx, PROMPT)
    assert not {img.expert_block(*le)[0] for le in pinned} & set(ctx.memory.offsets)


@pytest.mark.parametrize("board", with_rtos(["cortex_m55", "x86_64_baremetal"]))
def test_bare_metal_streaming_gives_the_resident_bits(board, streaming_images, firmwares, tmp_path):
    """On a bare-metal board the expert part is reached through the link's fetch hook, a copy out of the
    image region that stands in for external flash (docs/BOARDS.md); on a FreeRTOS build through the fetch task
    (docs/RTOS.md)."""
    path = tmp_path / "stream.img"
    path.write_bytes(streaming_images["base-q8_0"])
    greedy = Sampling()
    runs = {slots: run_on_board(path, board_name(board), PROMPT, 4, greedy, True, firmware=firmwares[board],
                                expert_cache=slots, prefetch=slots == 2) for slots in (0, 2, 8)}
    for slots in (2, 8):
        assert runs[slots].tokens == runs[0].tokens
        assert runs[slots].logits.tobytes() == runs[0].logits.tobytes(), slots
        assert runs[slots].stats["expert_misses"] > 0
    assert runs[0].stats["expert_misses"] == runs[0].stats["expert_bytes_fetched"] == 0
    assert runs[8].stats["expert_misses"] <= 8  # every expert fits: each fetched once


def big_expert_image(board_arena: int) -> bytes:
    """A Q8_0 model whose routed experts take more than 4x `board_arena` (random weights: a transformers
    checkpoint of this size would take longer to write than to run)."""
    from colibri.synthetic import moe_dims, random_image
    blob = random_image(moe_dims(hidden=256, ffn=512, experts=40, layers=2, max_seq=16), DType.Q8_0, seed=12)
    img = read_image(blob)
    assert len(blob) - img.resident_bytes > 4 * board_arena
    return blob


def test_cortex_m55_runs_a_model_whose_experts_are_4x_its_arena(firmwares, tmp_path):
    """docs/BOARDS.md: the M55's arena is 4 MiB of ISRAM; the experts live in DDR (standing in for external
    flash) and reach the arena only through the fetch hook, four slots at a time."""
    from colibri.flash import verify
    from colibri.sim.boards import load_board
    arena_capacity = load_board("cortex_m55").spec["memory"]["arena"]["bytes"]
    blob = big_expert_image(arena_capacity)
    path = tmp_path / "big.img"
    path.write_bytes(blob)
    img = read_image(blob)
    assert img.header["arena_bytes"] + expert_cache_bytes(img.expert_block_bytes, 4, crc_entries(img)) <= arena_capacity
    prompt = [5, 17, 33]
    streamed_run = run_on_board(path, "cortex_m55", prompt, 3, Sampling(), True, firmware=firmwares["cortex_m55"],
                                expert_cache=4, prefetch=True)
    resident_run = run_on_board(path, "cortex_m55", prompt, 3, Sampling(), True, firmware=firmwares["cortex_m55"])
    assert streamed_run.logits.tobytes() == resident_run.logits.tobytes()
    assert streamed_run.stats["expert_misses"] > 0 and streamed_run.stats["arena_bytes"] <= arena_capacity
    v = verify(Reference(read_image(blob)), prompt, streamed_run, Sampling())  # both agree with the reference, bit for bit
    assert v.passed and v.bit_identical and v.tokens_agree == v.tokens_checked == 3


def hot_routing_image(pinned: frozenset = frozenset()) -> bytes:
    """A routing pattern built for the cache policies: attention and experts are tiny, so the hidden state
    hardly changes from layer to layer, and every layer has the same router, which favours experts 0
    and 1 (a shared direction in every embedding). So the next layer's router on this layer's input
    names the next layer's experts (prefetch pays), and a trace finds a hot set (pinning pays)."""
    from colibri import image as im
    from colibri.rope import tables
    rng = np.random.default_rng(5)
    dims = im.ModelDims(vocab_size=32, hidden_size=32, ffn_size=16, n_layers=3, n_heads=2, n_kv_heads=1,
                        head_dim=16, n_experts=8, top_k=2, max_seq=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                        moe_layers=(True, True, True))
    common = rng.standard_normal(32).astype(np.float32)
    router = 0.1 * rng.standard_normal((8, 32)).astype(np.float32)
    router[0] += common
    router[1] += 0.8 * common
    tensors = {}
    for role, layer, expert in im.canonical_order(dims):
        if dims.present(role, layer):
            shape = im.expected_shape(dims, role, layer)
            t = 0.01 * rng.standard_normal(shape).astype(np.float32)
            if len(shape) == 1:
                t = np.ones(shape, np.float32)
            tensors[(role, layer, expert)] = t
    tensors[(im.Role.TOKEN_EMBD, im.NO_INDEX, im.NO_INDEX)] = (
        2.0 * common + 0.5 * rng.standard_normal((32, 32))).astype(np.float32)
    for layer in range(3):
        tensors[(im.Role.ROUTER, layer, im.NO_INDEX)] = router
    inv = 1.0 / (10000.0 ** (np.arange(0, 16, 2) / 16))
    tensors[(im.Role.ROPE_COS, im.NO_INDEX, im.NO_INDEX)], tensors[(im.Role.ROPE_SIN, im.NO_INDEX, im.NO_INDEX)] = \
        tables(inv, 1.0, dims.max_seq)
    return build_image(dims, tensors, pinned=pinned)


def test_pinning_and_prefetch_raise_hits_where_the_trace_says(lib, hosted_build, tmp_path):
    from colibri.flash import trace_report
    from colibri.pack import hot_experts
    prompt = list(range(0, 30, 3))
    plain = hot_routing_image()
    path = tmp_path / "hot.img"
    path.write_bytes(plain)
    traced = run_on_board(path, "hosted", prompt, 0, Sampling(), False, firmware=hosted_build / "firmware.elf", trace=True)
    hot = hot_experts(trace_report(traced, prompt, path), 4)
    assert {e for _, e in hot} <= {0, 1}  # the trace sees the pattern the router was built with

    def hit_rate(image: bytes, slots: int, prefetch: bool) -> tuple[float, Context]:
        ctx = streamed(lib, image, slots, prefetch)
        logits_after_each(ctx, prompt)
        s = ctx.stats()
        return s.expert_hits / (s.expert_hits + s.expert_misses), ctx

    base, _ = hit_rate(plain, 2, False)
    pinned, _ = hit_rate(hot_routing_image(hot), 2, False)
    assert pinned >= base + 0.5, (base, pinned)  # 4 of the 6 hot blocks never leave the resident part
    no_prefetch, _ = hit_rate(plain, 4, False)
    with_prefetch, ctx = hit_rate(plain, 4, True)
    s = ctx.stats()
    assert s.prefetch_issued > 0 and s.prefetch_used >= 0.9 * s.prefetch_issued  # the guesses were right
    assert with_prefetch >= no_prefetch + 0.3, (no_prefetch, with_prefetch)


@pytest.mark.parametrize("board_name", ["hosted", "hosted_windows"])
def test_hosted_board_survives_its_image_file_changing(board_name, streaming_images, firmwares, tmp_path):
    """boards/hosted/main.c: by default the file is mapped, so a truncation ends the board with a message
    and exit status 2 (Linux: the SIGBUS is caught; Windows: a vectored exception handler), never a crash;
    with --copy what the runtime reads in place is a private copy, so a truncated file changes nothing; with
    --stream the expert part is read from the file through the fetch hook, so a rewrite is
    COLIBRI_E_EXPERT_CRC, and a truncation COLIBRI_E_FETCH on Linux. Windows refuses to truncate a mapped
    file; under Wine a Linux process can, and the Windows board then ends as it does without --stream."""
    from colibri.protocol import STATUS_NAMES, Client, DeviceError, LinkError
    from colibri.sim.boards import load_board
    from colibri.sim.launch import start_board
    image = streaming_images["base-q8_0"]
    img = read_image(image)
    board, firmware, path = load_board(board_name), firmwares[board_name], tmp_path / "live.img"

    def session(args, change, expert_cache):
        path.write_bytes(image)
        with start_board(board, firmware, path, args) as device:
            client = Client(device.link, timeout=20)
            client.info()
            change()
            try:
                opened = client.open(expert_cache, prefetch=False)
                return client.run(PROMPT, 2, Sampling(), vocab=opened.vocab_size).logits
            finally:
                client.quit()

    clean = session(None, lambda: None, 0)
    assert session(["--copy"], lambda: None, 0).tobytes() == clean.tobytes()
    assert session(["--copy"], lambda: path.write_bytes(b""), 0).tobytes() == clean.tobytes()
    with pytest.raises(LinkError, match="colibri-hosted: the image file shrank"):
        session(None, lambda: path.write_bytes(b""), 0)
    assert session(["--stream"], lambda: None, 2).tobytes() == clean.tobytes()

    def code(err) -> str:
        return STATUS_NAMES[err.value.code]
    with pytest.raises(DeviceError) as err:  # --stream keeps only the resident part: no in-place OPEN
        session(["--stream"], lambda: None, 0)
    assert code(err) == "E_IMAGE_TRUNCATED"
    if board_name == "hosted_windows":
        with pytest.raises(LinkError, match="colibri-hosted: the image file shrank"):
            session(["--stream"], lambda: os.truncate(path, img.resident_bytes), 2)
    else:
        with pytest.raises(DeviceError) as err:
            session(["--stream"], lambda: os.truncate(path, img.resident_bytes), 2)
        assert code(err) == "E_FETCH"

    def rewrite_experts() -> None:
        data = bytearray(image)
        for layer, expert in img.streamed_experts():
            data[img.expert_block(layer, expert)[0] + 5] ^= 1
        with open(path, "r+b") as f:  # in place, same size
            f.write(data)
    with pytest.raises(DeviceError) as err:
        session(["--stream"], rewrite_experts, 2)
    assert code(err) == "E_EXPERT_CRC"
