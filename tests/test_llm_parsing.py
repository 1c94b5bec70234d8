"""Reply parsing: full code blocks, whitespace-tolerant SEARCH/REPLACE diffs, typed failures."""

from __future__ import annotations

import pytest
from llm_server import fenced, vecadd

from kfoundry.core.llm.novelty import NoveltyFilter, fingerprint, normalise_source
from kfoundry.core.llm.parsing import ParseFailure, apply_diff, extract_params, parse_reply

PARENT = vecadd(block=64, work=1)


def test_full_block_yields_source_params_and_rationale() -> None:
    parsed = parse_reply(fenced(vecadd(128, 4), plan="Use four elements per work-item."), "kernelbench")
    assert parsed.via == "block"
    assert parsed.source == vecadd(128, 4)
    assert parsed.space is not None and parsed.space.params["WORK"] == [1, 2, 4, 8]
    assert parsed.params == {"BLOCK": 128, "WORK": 4}
    assert "four elements" in parsed.rationale


def test_last_modelnew_block_wins_over_other_blocks() -> None:
    text = "```c\nint x;\n```\n" + fenced(vecadd(32, 1)) + fenced(vecadd(256, 2))
    assert parse_reply(text, "kernelbench").params == {"BLOCK": 256, "WORK": 2}


def test_diff_applies_exactly() -> None:
    reply = 'Bigger groups.\n<<<<<<< SEARCH\nBLOCK = PARAMS.get("BLOCK", 64)\n=======\nBLOCK = PARAMS.get("BLOCK", 256)\n>>>>>>> REPLACE\n'
    parsed = parse_reply(reply, "kernelbench", PARENT)
    assert parsed.via == "diff" and parsed.diffs_applied == 1
    assert parsed.params == {"BLOCK": 256, "WORK": 1}
    assert parsed.source == PARENT.replace('PARAMS.get("BLOCK", 64)', 'PARAMS.get("BLOCK", 256)')


def test_tunable_space_and_restrictions_are_read() -> None:
    parsed = parse_reply(
        fenced(vecadd(64, 2).replace("\nBLOCK =", '\nRESTRICTIONS = ["BLOCK * WORK <= 1024"]\nBLOCK =')),
        "kernelbench",
    )
    assert parsed.space is not None
    assert parsed.space.params == {"BLOCK": [32, 64, 128, 256], "WORK": [1, 2, 4, 8]}
    assert parsed.space.restrictions == ["BLOCK * WORK <= 1024"]


def test_literal_params_line_yields_to_the_harness() -> None:
    src = "import torch.nn as nn\nPARAMS = {'B': 4}\nclass ModelNew(nn.Module):\n    pass\n"
    parsed = parse_reply(fenced(src), "kernelbench")
    assert parsed.params == {"B": 4}
    ns: dict = {"PARAMS": {"B": 16}}
    exec(parsed.source, ns)
    assert ns["PARAMS"] == {"B": 16}  # the tuner's value wins
    ns = {}
    exec(parsed.source, ns)
    assert ns["PARAMS"] == {"B": 4}  # outside the harness the default holds


def test_diff_tolerates_indentation_spacing_and_blank_lines() -> None:
    # The model re-indented the block, doubled spaces and dropped a blank line.
    reply = (
        "<<<<<<< SEARCH\n"
        "def forward(self, a, b):\n"
        "    a, b  =  a.contiguous(), b.contiguous()\n"
        "    c = torch.empty_like(a)\n"
        "=======\n"
        "def forward(self, a, b):\n"
        "    a, b = a.contiguous(), b.contiguous()\n"
        "    c = torch.empty_like(a)  # output\n"
        ">>>>>>> REPLACE"
    )
    parsed = parse_reply(reply, "kernelbench", PARENT)
    assert "        c = torch.empty_like(a)  # output\n" in parsed.source  # re-indented to the class body
    compile(parsed.source, "x", "exec")


def test_diff_that_matches_nothing_is_a_parse_failure_naming_the_line() -> None:
    reply = "<<<<<<< SEARCH\nthis line is not in the parent\n=======\nx\n>>>>>>> REPLACE\n"
    with pytest.raises(ParseFailure, match="diff 1 of 1: SEARCH block not found.*this line is not"):
        parse_reply(reply, "kernelbench", PARENT)


def test_diff_without_parent_fails() -> None:
    with pytest.raises(ParseFailure, match="no parent"):
        parse_reply("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "kernelbench")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        (None, "empty"),
        ("I cannot help with that.", "no fenced code block"),
        ("```python\nclass ModelNew:\n    pass\n", "unclosed code block"),
        ("```python\nimport torch\n```", "no code block defines `class ModelNew`"),
        ("```python\nclass ModelNew(:\n    pass\n```", "does not parse as Python"),
    ],
)
def test_garbage_replies_fail_with_a_reason(text: object, reason: str) -> None:
    with pytest.raises(ParseFailure, match=reason):
        parse_reply(text, "kernelbench")


def test_native_kind_takes_the_kernel_block() -> None:
    text = "Plan.\n```python\nprint('host')\n```\n```opencl\n__kernel void k(__global float* x) { x[0] = 1; }\n```"
    assert parse_reply(text, "native").source.startswith("__kernel void k")


def test_ambiguous_search_is_refused_and_more_context_resolves_it() -> None:
    with pytest.raises(ParseFailure, match="matches 2 places"):
        apply_diff("a\nb\na\nc\n", "a\n", "z\n")
    with pytest.raises(ParseFailure, match="matches 2 places"):
        apply_diff("  x  = 1\ny\nx =  1\n", "x = 1", "z")
    assert apply_diff("a\nb\na\nc\n", "a\nc\n", "z\n") == "a\nb\nz\n"


def test_extract_params_ignores_non_literals() -> None:
    assert extract_params("PARAMS = dict(BLOCK=4)\nX = PARAMS.get(name, 3)\n") == {}
    assert extract_params("PARAMS = {'B': 4, 'F': 1.5, 'S': 'x', 'T': True}\n") == {
        "B": 4,
        "F": 1.5,
        "S": "x",
        "T": True,
    }


def test_novelty_ignores_whitespace_and_comments_but_not_code() -> None:
    a = vecadd(64, 1)
    b = a.replace(
        "    int i = get_global_id(0) * WORK;", "  int i = get_global_id(0)*WORK; // index\n  /* c */"
    )
    b = b.replace("import torch\n", "import torch  # torch\n\n")
    assert normalise_source(a) == normalise_source(b)
    assert fingerprint(a) != fingerprint(vecadd(64, 2))
    assert fingerprint(a, {"BLOCK": 1}) != fingerprint(a, {"BLOCK": 2})
    f = NoveltyFilter()
    assert f.admit(a) and not f.admit(b) and f.admit(vecadd(64, 2))
    assert f.rejected == 1
