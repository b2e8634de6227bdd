"""flash.py --trace against the reference's routing, and the routing report built from it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import board_name, make_family_checkpoint, with_rtos
from colibri import flash
from colibri.image import read_image
from colibri.pack import pack
from colibri.protocol import Sampling
from colibri.reference import Reference
from colibri import routing_report

PROMPT = [1, 5, 9, 3]


@pytest.fixture(scope="module")
def mixed_image(tmp_path_factory):
    """A Qwen2-MoE with a dense layer between MoE layers and a shared expert."""
    base = tmp_path_factory.mktemp("trace")
    ckpt = make_family_checkpoint("Qwen2MoeForCausalLM", dict(
        vocab_size=40, num_hidden_layers=3, hidden_size=24, num_attention_heads=3, num_key_value_heads=1,
        intermediate_size=16, moe_intermediate_size=10, shared_expert_intermediate_size=12, num_experts=5,
        num_experts_per_tok=2, mlp_only_layers=[1], norm_topk_prob=False), 9, base / "ckpt")
    pack(ckpt, base / "mixed.img", 32, 64)
    return base / "mixed.img"


@pytest.mark.parametrize("board", with_rtos(["hosted", "x86_64_baremetal", "cortex_m4", "riscv64_virt"]))
@pytest.mark.parametrize("which", ["base", "mixed"])
def test_trace_matches_reference_routing(board, which, images, mixed_image, firmwares, tmp_path):
    image = images["base"] if which == "base" else mixed_image
    result = flash.run_on_board(image, board_name(board), PROMPT, 6, Sampling(), False, firmware=firmwares[board], trace=True)
    ref = Reference(read_image(image.read_bytes()))
    routes, sums = ref.traced(PROMPT + result.tokens)
    assert len(result.traces) == len(PROMPT) + 6
    for pos, layers in enumerate(result.traces):
        assert [t.layer for t in layers] == list(range(ref.d.n_layers))
        for t in layers:
            # the residual stream after each half of each layer: the reference's bits (a traced run feeds one
            # token a pass, so every token carries the attention half's CRC)
            assert [t.crc_attention, t.crc_output] == sums[t.layer][pos].tolist(), (pos, t.layer)
            # every board's clock advances during real work; a wrapped or garbage counter would be huge
            assert 0 < t.cycles_attention < 2**40 and 0 < t.cycles_ffn < 2**40 and t.cycles_router < 2**40
            if ref.d.moe_layers[t.layer]:
                idx, w = routes[t.layer]
                assert t.experts == idx[pos].tolist()
                assert np.asarray(t.weights, np.float32).tobytes() == w[pos].tobytes()  # bit for bit
                assert len(t.cycles_expert) == ref.d.top_k
                assert 0 < sum(t.cycles_expert) <= t.cycles_ffn  # the experts run inside the FFN phase
            else:
                assert t.experts == [] and t.weights == []

    # the report's usage counts are the reference's routing, counted
    trace_file = tmp_path / "trace.json"
    trace_file.write_text(json.dumps(flash.trace_report(result, PROMPT, image)))
    a = routing_report.analyse(json.loads(trace_file.read_text()))
    for layer, (idx, _) in routes.items():
        np.testing.assert_array_equal(a["usage"][layer], np.bincount(idx.ravel(), minlength=ref.d.n_experts))
    assert routing_report.main([str(trace_file), "--out", str(tmp_path / "r")]) == 0
    for png in ("r-usage.png", "r-entropy.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text,says", [
    ("{}", "is not a trace (no n_layers, n_experts, top_k, trace)"),
    ('{"n_layers": 2, "n_experts": 4, "top_k": 2, "trace": [{"layers": [{"layer": 0}]}]}', "is not a trace colibri run wrote"),
    ("not json", "cannot read"),
])
def test_a_bad_trace_file_is_one_line_and_exit_2(text, says, tmp_path, capsys):
    (tmp_path / "t.json").write_text(text)
    assert routing_report.main([str(tmp_path / "t.json"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_trace_records_hold_every_layer_the_verifier_allows(hosted_build, tmp_path):
    """link.c's trace hook and protocol.parse_trace agree on layers past 16 bits (the verifier allows 2^24), for
    0, 1 and 2 routed experts, with both CRCs (tests/trace_record.c: the hook on six records)."""
    import subprocess

    from conftest import ROOT
    from colibri.protocol import LayerTrace, parse_trace
    exe = tmp_path / "trace_record"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-Iboards/common", "-Ifirmware/include", "tests/trace_record.c",
                    str(hosted_build / "libcolibri.a"), "-o", str(exe)], cwd=ROOT, check=True)
    records = parse_trace(bytes.fromhex(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout))
    experts, weights, cycles = [3, 1], [0.75, 0.25], [11, 1 << 40]
    want = [LayerTrace(layer, 100 + i, 200 + i, 300 + i, experts[:i % 3], weights[:i % 3], cycles[:i % 3],
                       0xDEADBEEF - i, 0x80000000 + i)
            for i, layer in enumerate([0, 255, 65535, 65536, 70001, (1 << 24) - 1])]
    assert records == want
