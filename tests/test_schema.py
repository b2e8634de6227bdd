"""format/schema.toml is the one definition of the image format's and the link's facts: the checked-in copies
(firmware/src/format.h, colibri/format.py and codes.py, docs/FORMAT.md's tables, the status codes in colibri.h and
colibri.c, the frame types in link.c, the fuzz dictionaries) are what it writes, and the check notices when one is not."""
from __future__ import annotations

import struct

import pytest

from conftest import ROOT
from colibri import schema


def test_the_checked_in_copies_are_what_the_schema_writes(capsys):
    assert schema.main(["--check"]) == 0, capsys.readouterr().err


def test_the_check_names_a_copy_edited_by_hand(tmp_path, monkeypatch, capsys):
    """A hand edit of any copy (a header offset in C, a flag in Python, a table row in the docs, a status code, its
    message, a frame type, a link error code) fails the check, and writing puts the schema's text back."""
    copies = {}
    for attr in ("C_HEADER", "PY_MODULE", "PY_CODES", "DOC", "API_HEADER", "API_SOURCE", "LINK_SOURCE", "LINK_DICT",
                 "IMAGE_DICT", "PLAN_HEADER"):
        path = tmp_path / getattr(schema, attr).name
        path.write_text(getattr(schema, attr).read_text())
        monkeypatch.setattr(schema, attr, path)
        copies[attr] = path
    monkeypatch.setattr(schema, "ROOT", tmp_path)
    edits = {"C_HEADER": ("H_EPS = 76", "H_EPS = 77"), "PY_MODULE": ("LAYER_OPT_V_NORM = 1 << 7", "LAYER_OPT_V_NORM = 1 << 8"),
             "DOC": ("| 76 | f32 | rms_norm_eps |", "| 77 | f32 | rms_norm_eps |"), "PY_CODES": ("REQ_TRACE = 0x0C", "REQ_TRACE = 0x0D"),
             "API_HEADER": ("COLIBRI_E_FETCH = 22,", "COLIBRI_E_FETCH = 23,"),
             "API_SOURCE": ('"arena overlaps the image"', '"arena overlap"'), "LINK_SOURCE": ("LINK_NOT_OPEN = 204", "LINK_NOT_OPEN = 209"),
             "LINK_DICT": ('"\\xa5\\x5a\\x0c"', '"\\xa5\\x5a\\x0d"'),
             "IMAGE_DICT": (f'"\\x{schema.load().format["version"]:02x}\\x00\\x00\\x00"', '"\\x04\\x00\\x00\\x00"'),
             "PLAN_HEADER": ("X(x, 4u, (uint64_t)d->dim, 1)", "X(x, 8u, (uint64_t)d->dim, 1)")}
    for attr, (old, new) in edits.items():
        path = copies[attr]
        original = path.read_text()
        assert old in original
        path.write_text(original.replace(old, new))
        assert schema.main(["--check"]) == 1
        assert f"{path.name} is not what format/schema.toml gives" in capsys.readouterr().err
        assert schema.main([]) == 0 and path.read_text() == original


def test_fields_must_fill_the_header_exactly(tmp_path):
    text = schema.SCHEMA.read_text().replace('c = "RESERVED"\ntype = "u8[8]"', 'c = "RESERVED"\ntype = "u8[4]"')
    bad = tmp_path / "schema.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match="the header fields take 764 bytes, not 768"):
        schema.load(bad)


@pytest.mark.parametrize("old,new,error", [
    ('{ name = "WQ", shape = ["q_dim", "D"]', '{ name = "WQ", shape = ["q_width", "D"]', "must be one or two of the terms"),
    ('when = "QKV_BIAS & OWN_KV & !K_IS_V"', 'when = "QKV_BIAS & OWN_KV & !K_IS_Q"', "names K_IS_Q, neither a layer option nor a fact"),
    ('{ name = "OUTPUT_NORM", shape = ["D"]', '{ name = "OUTPUT_NORM", shape = ["q_dim"]', "a global tensor's shape may not use"),
    ('when = "GLOBAL_ROPE_TABLES", gguf = "rope_cos_global"', 'when = "MOE", gguf = "rope_cos_global"',
     "a global tensor's `when` may name model-wide facts only"),
    ('when = "GLOBAL_ROPE_TABLES", gguf = "rope_cos_global"', 'when = "GLOBAL_ROPE", gguf = "rope_cos_global"',
     "a global tensor's `when` may name model-wide facts only"),
    ('{ name = "BQ",', '{ name = "WQ",', "role WQ is defined twice"),
    ('name = "q_att"\nlifetime = "model"\nelem = "4"\ncount = "H * att_dim"',
     'name = "q_att"\nlifetime = "model"\nelem = "4"\ncount = "H * att_width"', "'att_width' is neither a number nor"),
    ('count = "in_blocks * QBLOCK"\n', 'count = "in_blocks * QBLOCK"\nwhen = "quantized"\n', "is not a plan condition"),
    ('name = "xn"\nlifetime = "model"', 'name = "x"\nlifetime = "model"', "listed twice"),
    ('[[layer]]\nname = "router"', '[[layer]]\nname = "router_kind"', "needs its u8 field in"),
    ('name = "NORM_TOPK"\nneeds = "experts"', 'name = "NORM_TOPK"\nneeds = "moe"', "`needs` is one of"),
    ('name = "Q8_0"\nblock = 32\nbytes = 32\nscale_bytes = 2\n', 'name = "Q8_0"\nblock = 32\nbytes = 32\nscale_bytes = 2\n'
     'offset = true\n', "an offset on a dtype that is not a block dtype"),
])
def test_a_role_the_runtime_could_not_read_is_refused(tmp_path, old, new, error):
    """A role's shape and presence are checked when the schema is read: terms and facts that exist, a global tensor
    that tests nothing of a layer (the runtime computes a global's terms and facts for no particular layer), names
    once."""
    text = schema.SCHEMA.read_text()
    assert old in text
    bad = tmp_path / "schema.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match=error):
        schema.load(bad)


def test_the_python_copy_lays_the_header_out_as_the_c_copy_does():
    """Each header field's offset as Python's struct module places it by colibri/format.py's format string is its H_
    constant in format.h (the runtime's verifier reads the C; the packer writes with the Python), and the packed
    fields end where `reserved` begins."""
    import re

    from colibri import format as fmt
    c_text = (ROOT / "firmware" / "src" / "format.h").read_text()
    c_offsets = {name: int(v) for name, v in re.findall(r"\bH_([A-Z0-9_]+) = (\d+)", c_text)}
    codes = re.findall(r"\d*[a-zA-Z]", fmt.HEADER_FORMAT[1:])
    assert len(codes) == len(fmt.HEADER_FIELDS)
    for i, name in enumerate(fmt.HEADER_FIELDS):
        offset = struct.calcsize("<" + "".join(codes[:i]))
        assert fmt.HEADER_OFFSETS[name] == offset == c_offsets[schema.load().field(name).c], name
    assert struct.calcsize(fmt.HEADER_FORMAT) == c_offsets["RESERVED"] == fmt.HEADER_OFFSETS["reserved"]


def test_a_marker_quoted_in_prose_is_not_one_and_a_broken_pair_is_refused():
    """The regions are replaced between marker lines only: a marker quoted inside a sentence leaves the text around it
    alone, and a missing, repeated or misordered marker is an error, never a deletion."""
    text = "intro `<!-- schema:x -->` quoted\n<!-- schema:x -->\nold\n<!-- /schema:x -->\nafter"
    assert schema.replace_region(text, "x", "new", "t") == text.replace("\nold\n", "\nnew\n")
    for broken in ("<!-- /schema:x -->\n<!-- schema:x -->", "<!-- schema:x -->\n<!-- schema:x -->\n<!-- /schema:x -->",
                   "<!-- schema:x -->\nno end"):
        with pytest.raises(ValueError, match="needs one line starting with the marker schema:x"):
            schema.replace_region(broken, "x", "new", "t")


def test_the_image_mutator_edits_every_header_and_entry_field():
    """tests/fuzz/image_mutator.c's structure edits walk the fields format.h lists, and the lists name every header
    field but the CRCs (which the reseal computes) and the byte arrays (the magic and reserved bytes, left to
    libFuzzer's byte mutations; the layer records and kinds, which the mutator edits a field at a time, and a record's
    options a bit at a time), and every table-entry and layer-record field, each with its size."""
    import re
    mutator = (ROOT / "tests" / "fuzz" / "image_mutator.c").read_text()
    for macro in ("IMG_HEADER_INTEGERS(FIELD)", "IMG_HEADER_FLOATS(FIELD)", "IMG_ENTRY_FIELDS(FIELD)",
                  "IMG_LAYER_FIELDS(FIELD)", "H_KINDS", "H_LAYER_KIND", "LAYER_OPTION_COUNT", "R_OPTIONS"):
        assert macro in mutator, macro
    c_text = (ROOT / "firmware" / "src" / "format.h").read_text().replace("\\\n", " ")
    def listed(macro: str) -> dict[str, int]:
        body = re.search(rf"#define {macro}\(X\)(.*)", c_text).group(1)
        return {name: int(size) for name, size in re.findall(r"X\([HER]_([A-Z0-9_]+), (\d+)\)", body)}
    s = schema.load()
    edited = listed("IMG_HEADER_INTEGERS") | listed("IMG_HEADER_FLOATS")
    apart = {h.c for h in s.header if h.crc or h.type.startswith("u8[")}
    assert not edited.keys() & apart
    assert edited | {c: 0 for c in apart} == {h.c: edited.get(h.c, 0) for h in s.header}
    assert all(edited[h.c] == h.size for h in s.header if h.c in edited)
    assert listed("IMG_ENTRY_FIELDS") == {e.c: e.size for e in s.entry}
    assert listed("IMG_LAYER_FIELDS") == {r.c: r.size for r in s.layer}
    assert {h.name for h in s.header if h.crc} == {"header_crc32", "payload_crc32", "meta_crc32"}
