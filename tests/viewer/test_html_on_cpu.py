"""The trajectory page's HTML for hand-written records (records are untrusted input): a tool call's ``code`` argument
(the python tool's) as an escaped code block, other arguments as JSON."""

from __future__ import annotations

import pytest

from verl_mm_tools.tools import PythonTool
from verl_mm_tools.viewer.html import CODE_ARGUMENT, trajectory_page

HOSTILE_CODE = 'print("<b>hi</b>")\n</code></pre><script>alert(1)</script>\n\tx = 1 & 2'


def page_of(*calls: dict) -> str:
    message = {"role": "assistant", "turn": 1, "text": "calling", "tool_calls": list(calls)}
    return trajectory_page({"id": "abcdef123456", "messages": [message]}, None, "index.html", (None, None))


def test_the_python_tools_code_argument_is_what_the_viewer_shows_as_code():
    assert list(PythonTool().tool_schema.function.parameters.properties) == [CODE_ARGUMENT]


def test_code_is_an_escaped_code_block_keeping_its_lines():
    page = page_of({"name": "python", "arguments": {"code": HOSTILE_CODE}})
    assert (
        '<div class="call"><b>python</b><pre class="code"><code>'
        "print(&quot;&lt;b&gt;hi&lt;/b&gt;&quot;)\n"
        "&lt;/code&gt;&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;\n"
        "\tx = 1 &amp; 2</code></pre></div>"
    ) in page
    assert "<script>alert(1)" not in page and page.count("<script") == 0  # the trajectory page runs no script


def test_other_arguments_beside_code_stay_json():
    page = page_of({"name": "python", "arguments": {"code": "1 + 1", "timeout": 3, "note": "<i>"}})
    assert (
        '<div class="call"><b>python</b><pre class="code"><code>1 + 1</code></pre>'
        "<pre>{\n &quot;timeout&quot;: 3,\n &quot;note&quot;: &quot;&lt;i&gt;&quot;\n}</pre></div>"
    ) in page


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ({"degrees": 90}, "<pre>{\n &quot;degrees&quot;: 90\n}</pre>"),  # no code: JSON as before
        ({"code": 42}, "<pre>{\n &quot;code&quot;: 42\n}</pre>"),  # a code that is no string: JSON
        ('{"code": "1 +', "<pre>{&quot;code&quot;: &quot;1 +</pre>"),  # not JSON: the raw text the model wrote
        (None, "<pre>null</pre>"),
    ],
    ids=["no-code", "code-not-a-string", "raw-text", "none"],
)
def test_calls_without_a_code_string_show_their_arguments_as_before(arguments, shown):
    assert f'<div class="call"><b>rotate</b>{shown}</div>' in page_of({"name": "rotate", "arguments": arguments})
